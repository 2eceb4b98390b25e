package fsm_test

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/leasehold/leasehold/fsm"
)

// gen draws a random but reproducible log of commands over a handful of
// keys, holders, leases and sessions. Tokens are right most of the time and
// wrong or missing sometimes; ids are picked with a bias towards recent ones
// so that most commands hit live records.
type gen struct {
	r    *rand.Rand
	full bool // also waits, idempotency keys, CancelWait, reused ids, stale ticks, metadata
	// members: also Member commands (some invalid). Off, the generator
	// draws exactly what it drew before they existed, so that pinned logs
	// (testdata/snapshot_v1.json) stay the same.
	members bool
	// grantKeys: with members, some of those commands are MemberKey
	// (grantkey.go), some refused. Off, the generator draws exactly what
	// it drew before they existed.
	grantKeys bool
	// chunk: ticks end at most this many records and Expire entries
	// (some stale) end the rest (expire.go). 0: unlimited ticks, as
	// the generator drew before chunked expiry existed.
	chunk uint64
	// prune: with chunk, ticks prune at most this many records
	// (prune.go). 0: unlimited, as the generator drew before chunked
	// pruning existed.
	prune uint64
	// meta: renewals and heartbeat items sometimes carry metadata
	// (renewmeta.go), some past the limits, some on bound leases. Off,
	// the generator draws exactly what it drew before they existed.
	meta bool
	// groups: lease groups (group.go) are acquired (waiting and
	// idempotent ones too when full), renewed and released, and their
	// members named by single-lease commands. Off, the generator draws
	// exactly what it drew before they existed.
	groups bool

	tick       uint64
	nLease     int
	nSession   int
	leases     []string // granted lease ids (told by granted)
	queued     []string // lease ids queued for a slot (told by granted)
	proposed   []string // every lease id proposed
	leaseKey   map[string]string
	leaseSess  map[string]string
	sessions   []string
	sessHolder map[string]string
	nGroup     int
	groupIDs   []string // every group proposed
	groupsHeld []string // groups granted (told by granted)
	groupSess  map[string]string
	lastIdem   *fsm.AcquireGroup // the last idempotent group acquire, to retry
}

// genRetain is the RetainTicks of every generated tick.
const genRetain = 8

var (
	genKeys    = []string{"k0", "k1", "k2", "k3"}
	genLimits  = map[string]uint32{"k0": 1, "k1": 2, "k2": 1, "k3": 3}
	genHolders = []string{"h0", "h1", "h2"}
)

func newGen(seed uint64, full bool) *gen {
	return &gen{
		r:          rand.New(rand.NewPCG(seed, 0x1ea5e)),
		full:       full,
		leaseKey:   map[string]string{},
		leaseSess:  map[string]string{},
		sessHolder: map[string]string{},
		groupSess:  map[string]string{},
	}
}

// entry returns the command of the next log entry: usually one command,
// sometimes a batch of a few.
func (g *gen) entry() fsm.Command {
	if g.r.IntN(100) < 12 {
		b := &fsm.Batch{}
		for range 2 + g.r.IntN(3) {
			b.Commands = append(b.Commands, g.command())
		}
		return b
	}
	return g.command()
}

func (g *gen) pick(ids []string) string {
	if len(ids) == 0 || g.r.IntN(25) == 0 {
		return "none"
	}
	if g.r.IntN(4) > 0 {
		return ids[len(ids)-1-g.r.IntN(min(len(ids), 10))]
	}
	return ids[g.r.IntN(len(ids))]
}

func (g *gen) token(id string) fsm.Hash {
	switch x := g.r.IntN(20); {
	case x < 17:
		return tok(id)
	case x < 19:
		return badTok
	default:
		return fsm.Hash{}
	}
}

// metadata draws what a renewal sets: usually a few entries, sometimes
// none (clearing), sometimes too many (refused).
func (g *gen) metadata() map[string]string {
	switch x := g.r.IntN(10); {
	case x == 0:
		return nil
	case x == 1:
		m := map[string]string{}
		for i := range fsm.MaxMetaEntries + 1 {
			m[fmt.Sprint("k", i)] = ""
		}
		return m
	default:
		m := map[string]string{"n": fmt.Sprint(g.r.IntN(1000))}
		if x > 6 {
			m["tick"] = fmt.Sprint(g.tick)
		}
		return m
	}
}

func (g *gen) holder() string { return genHolders[g.r.IntN(len(genHolders))] }

func (g *gen) ttl() uint64 { return 1 + uint64(g.r.IntN(6)) }

func (g *gen) command() fsm.Command {
	if g.members && g.r.IntN(30) == 0 {
		if g.grantKeys && g.r.IntN(2) == 0 {
			return g.memberKey()
		}
		return g.member()
	}
	wall := int64(g.tick)*periodMS + int64(g.r.IntN(periodMS))
	if g.groups && g.r.IntN(8) == 0 {
		return g.group(wall)
	}
	switch x := g.r.IntN(100); {
	case x < 30:
		return g.acquire(wall)
	case x < 42:
		id := g.pick(g.leases)
		c := &fsm.Renew{LeaseID: id, TokenHash: g.token(id), WallMS: wall}
		if g.r.IntN(5) == 0 {
			c.TTLTicks = g.ttl()
			c.TTLMS = int64(c.TTLTicks) * periodMS
		}
		if g.meta && g.r.IntN(3) == 0 {
			c.Metadata, c.SetMetadata = g.metadata(), true
		}
		return c
	case x < 52:
		id := g.pick(g.leases)
		c := &fsm.Release{LeaseID: id, WallMS: wall}
		if sid := g.leaseSess[id]; sid != "" && g.r.IntN(3) == 0 {
			c.SessionTokenHash = g.token(sid)
		} else {
			c.TokenHash = g.token(id)
		}
		if g.r.IntN(3) == 0 {
			c.Reason = "done"
		}
		return c
	case x < 56:
		return &fsm.Revoke{LeaseID: g.pick(g.leases), Reason: []string{"", "op"}[g.r.IntN(2)], WallMS: wall}
	case x < 59:
		c := &fsm.Heartbeat{WallMS: wall}
		for range 1 + g.r.IntN(3) {
			id := g.pick(g.leases)
			it := fsm.HeartbeatItem{LeaseID: id, TokenHash: g.token(id)}
			if g.meta && g.r.IntN(3) == 0 {
				it.Metadata, it.SetMetadata = g.metadata(), true
			}
			c.Items = append(c.Items, it)
		}
		return c
	case x < 63:
		id := fmt.Sprintf("S%d", g.nSession)
		g.nSession++
		ttl := 2 + uint64(g.r.IntN(7))
		c := &fsm.SessionCreate{SessionID: id, Holder: g.holder(), TokenHash: tok(id),
			TTLMS: int64(ttl) * periodMS, TTLTicks: ttl, WallMS: wall}
		g.sessions = append(g.sessions, id)
		g.sessHolder[id] = c.Holder
		return c
	case x < 68:
		id := g.pick(g.sessions)
		return &fsm.SessionHeartbeat{SessionID: id, TokenHash: g.token(id), WallMS: wall}
	case x < 70:
		id := g.pick(g.sessions)
		return &fsm.SessionEnd{SessionID: id, TokenHash: g.token(id), Force: g.r.IntN(10) == 0, WallMS: wall}
	case x < 71:
		return &fsm.ReleaseHolder{Holder: g.holder(), Reason: []string{"", "restart"}[g.r.IntN(2)], WallMS: wall}
	case x < 74 && g.full:
		id := g.pick(g.proposed)
		key := g.leaseKey[id]
		if key == "" || g.r.IntN(10) == 0 {
			key = genKeys[g.r.IntN(len(genKeys))]
		}
		return &fsm.CancelWait{LeaseID: id, Key: key}
	default:
		if g.chunk > 0 && g.r.IntN(2) == 0 {
			// Mostly of the current tick; sometimes of another one
			// (stale), which is ignored.
			t := g.tick
			if g.r.IntN(8) == 0 {
				t -= min(t, 1)
			}
			return &fsm.Expire{Tick: t, WallMS: wall, Max: 1 + uint64(g.r.IntN(int(g.chunk)))}
		}
		if g.full && g.r.IntN(10) == 0 {
			// A duplicate or a jump: both are ignored.
			return &fsm.Tick{Tick: g.tick + uint64(g.r.IntN(2))*2, WallMS: wall, PeriodMS: periodMS, RetainTicks: genRetain, ExpireMax: g.chunk, PruneMax: g.prune}
		}
		g.tick++
		return &fsm.Tick{Tick: g.tick, WallMS: int64(g.tick) * periodMS, PeriodMS: periodMS, RetainTicks: genRetain, ExpireMax: g.chunk, PruneMax: g.prune}
	}
}

// genServers are the server ids of generated Member commands.
var genServers = []string{"n1", "n2", "n3", "n4", "n5"}

// member returns a Member: usually a server joining or being removed with
// one of a few incarnations, sometimes an invalid one.
func (g *gen) member() *fsm.Member {
	c := &fsm.Member{ID: genServers[g.r.IntN(len(genServers))],
		Incarnation: fmt.Sprintf("inc-%d", g.r.IntN(3)), Removed: g.r.IntN(4) == 0}
	switch g.r.IntN(20) {
	case 0:
		c.ID = ""
	case 1:
		c.Incarnation = "bad\x00inc"
	case 2:
		c.Incarnation = ""
	}
	return c
}

// memberKey returns a MemberKey: one of a few keys for a server, sometimes
// the zero key or an unknown server (both refused).
func (g *gen) memberKey() *fsm.MemberKey {
	c := &fsm.MemberKey{ID: genServers[g.r.IntN(len(genServers))]}
	c.Key[0], c.Key[31] = byte(1+g.r.IntN(4)), byte(g.r.IntN(3))
	switch g.r.IntN(20) {
	case 0:
		c.Key = fsm.GrantKey{}
	case 1:
		c.ID = "n9"
	}
	return c
}

func (g *gen) acquire(wall int64) *fsm.Acquire {
	id := fmt.Sprintf("L%d", g.nLease)
	g.nLease++
	if g.full && len(g.proposed) > 0 && g.r.IntN(20) == 0 {
		// The state machine must refuse or cope. Recent ids are likely
		// still queued on some key.
		id = g.pick(g.proposed)
	}
	key := genKeys[g.r.IntN(len(genKeys))]
	if g.full && len(g.queued) > 0 && g.r.IntN(25) == 0 {
		// The id of a queued acquire, on another key.
		id = g.queued[len(g.queued)-1]
		if key == g.leaseKey[id] {
			key = genKeys[(slices.Index(genKeys, key)+1)%len(genKeys)]
		}
	}
	limit := genLimits[key]
	if g.r.IntN(15) == 0 {
		limit = 1 + uint32(g.r.IntN(3))
	}
	a := &fsm.Acquire{LeaseID: id, Key: key, Limit: limit, TokenHash: tok(id), WallMS: wall}
	if len(g.sessions) > 0 && g.r.IntN(4) == 0 {
		sid := g.pick(g.sessions)
		a.SessionID, a.SessionTokenHash = sid, g.token(sid)
		switch g.r.IntN(5) {
		case 0:
			a.Holder = g.sessHolder[sid]
		case 1:
			a.Holder = g.holder()
		}
		g.leaseSess[id] = sid
	} else {
		a.Holder = g.holder()
		a.TTLTicks = g.ttl()
		a.TTLMS = int64(a.TTLTicks) * periodMS
	}
	if g.r.IntN(3) == 0 {
		a.LockDelayTicks = 1 + uint64(g.r.IntN(4))
		a.LockDelayMS = int64(a.LockDelayTicks) * periodMS
	}
	if g.full {
		if g.r.IntN(3) == 0 {
			a.WaitTicks = 1 + uint64(g.r.IntN(8))
		}
		if g.r.IntN(5) == 0 {
			a.IdemHash = fsm.HashOf(fmt.Sprintf("idem %s %d", a.Holder, g.r.IntN(4)))
			a.Fingerprint = fsm.HashOf(fmt.Sprint("fp ", g.r.IntN(2)))
			a.SealedToken = []byte("sealed " + id)
		}
		if g.r.IntN(8) == 0 {
			a.Metadata = map[string]string{"owner": a.Holder, "id": id}
		}
	}
	g.proposed = append(g.proposed, id)
	g.leaseKey[id] = key
	return a
}

// group returns a lease group command: mostly an acquire of two or three
// keys (sometimes with the wrong limit for one, bound to a session,
// waiting, idempotent, with a lock-delay), else a renewal or release of a
// group proposed earlier, with the right token most of the time.
func (g *gen) group(wall int64) fsm.Command {
	switch x := g.r.IntN(10); {
	case x < 2:
		id := g.pick(g.groupsHeld)
		c := &fsm.RenewGroup{GroupID: id, TokenHash: g.token(id), WallMS: wall}
		if g.r.IntN(4) == 0 {
			c.TTLTicks = g.ttl()
			c.TTLMS = int64(c.TTLTicks) * periodMS
		}
		return c
	case x < 4:
		id := g.pick(g.groupIDs)
		if g.r.IntN(4) > 0 {
			id = g.pick(g.groupsHeld)
		}
		c := &fsm.ReleaseGroup{GroupID: id, WallMS: wall, Reason: []string{"", "done"}[g.r.IntN(2)]}
		if sid := g.groupSess[id]; sid != "" && g.r.IntN(2) == 0 {
			c.SessionTokenHash = g.token(sid)
		} else {
			c.TokenHash = g.token(id)
		}
		return c
	}
	id := fmt.Sprintf("G%d", g.nGroup)
	g.nGroup++
	if last := g.lastIdem; g.full && last != nil && g.r.IntN(3) == 0 {
		// A client's retry: the same request and idempotency key, with
		// the new ids its node drew.
		c := *last
		c.GroupID, c.Keys = id, slices.Clone(last.Keys)
		for i := range c.Keys {
			c.Keys[i].LeaseID = fmt.Sprintf("L%d", g.nLease)
			g.nLease++
		}
		if g.r.IntN(4) == 0 {
			c.Fingerprint = fsm.HashOf("another request")
		}
		return &c
	}
	keys := slices.Clone(genKeys)
	g.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	keys = keys[:2+g.r.IntN(2)]
	slices.Sort(keys)
	c := &fsm.AcquireGroup{GroupID: id, TokenHash: tok(id), WallMS: wall}
	for _, k := range keys {
		lid := fmt.Sprintf("L%d", g.nLease)
		g.nLease++
		limit := genLimits[k]
		if g.r.IntN(20) == 0 {
			limit = 1 + uint32(g.r.IntN(3))
		}
		c.Keys = append(c.Keys, fsm.GroupKey{LeaseID: lid, Key: k, Limit: limit})
		g.proposed = append(g.proposed, lid)
		g.leaseKey[lid] = k
	}
	if len(g.sessions) > 0 && g.r.IntN(4) == 0 {
		sid := g.pick(g.sessions)
		c.SessionID, c.SessionTokenHash = sid, g.token(sid)
		g.groupSess[id] = sid
		for _, k := range c.Keys {
			g.leaseSess[k.LeaseID] = sid
		}
	} else {
		c.Holder = g.holder()
		c.TTLTicks = g.ttl()
		c.TTLMS = int64(c.TTLTicks) * periodMS
	}
	if g.r.IntN(3) == 0 {
		c.LockDelayTicks = 1 + uint64(g.r.IntN(4))
		c.LockDelayMS = int64(c.LockDelayTicks) * periodMS
	}
	if g.full {
		if g.r.IntN(2) == 0 {
			c.WaitTicks = 1 + uint64(g.r.IntN(8))
		}
		if g.r.IntN(5) == 0 {
			c.IdemHash = fsm.HashOf(fmt.Sprintf("idem group %s %d", c.Holder, g.r.IntN(3)))
			c.Fingerprint = fsm.HashOf(fmt.Sprint("fp ", g.r.IntN(2)))
			c.SealedToken = []byte("sealed " + id)
			g.lastIdem = c
		}
	}
	g.groupIDs = append(g.groupIDs, id)
	return c
}

// granted tells the generator which leases the state machine granted, so
// that later commands mostly name leases that exist.
func (g *gen) granted(res []fsm.Result, notices []fsm.Notice) {
	for _, r := range res {
		if r.Err == nil && !r.Queued && !r.Replayed && r.Lease == nil {
			for _, l := range r.Leases { // a lease group granted at once
				g.leases = append(g.leases, l.ID)
			}
			if len(r.Leases) > 0 {
				g.groupsHeld = append(g.groupsHeld, r.Leases[0].GroupID())
			}
		}
		switch {
		case r.Err != nil || r.Lease == nil || r.Replayed:
		case r.Queued:
			g.queued = append(g.queued, r.Lease.ID)
		default:
			g.leases = append(g.leases, r.Lease.ID)
		}
	}
	for _, n := range notices {
		if n.Leases != nil { // a lease group granted after a wait
			for _, l := range n.Leases {
				g.leases = append(g.leases, l.ID)
			}
			g.groupsHeld = append(g.groupsHeld, n.LeaseID)
			continue
		}
		if n.Lease != nil {
			g.leases = append(g.leases, n.Lease.ID)
		}
	}
}

// flatten returns the commands of an entry in apply order.
func flatten(c fsm.Command) []fsm.Command {
	if b, ok := c.(*fsm.Batch); ok {
		return b.Commands
	}
	return []fsm.Command{c}
}
