package fsm

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// ReasonRestore is the end reason of a lease of a restored snapshot that
// the restore did not bring back: its key (or its session) was in use when
// the snapshot was restored.
const ReasonRestore = "restore"

// RebaseStats says what Rebase did.
type RebaseStats struct {
	// DroppedWaits counts the queued acquires of the file withdrawn.
	// (The running state's are withdrawn too; the node that restores
	// fails them.)
	DroppedWaits int
	// Refenced counts the leases of the file that are active after the
	// restore, each with a new fencing token.
	Refenced int
	// Kept counts the leases live before the restore, kept as they were.
	Kept int
	// Superseded counts the leases of the file not brought back because
	// their key or session was in use before the restore (ended, revoked
	// with reason ReasonRestore).
	Superseded int
	// TickShift is how many ticks the file's clock moved forward to join
	// the running one (remaining times are kept).
	TickShift uint64
}

// Rebase readies f, a state decoded from an operator's backup, to replace
// cur, the state a running cluster has applied, as of log index index
// (every replica calls it when it applies the restore's RestoreCommit entry
// at that index: restore.go). A restore never goes backwards:
//
//   - f continues at index (never lower than its own index): every entry
//     applied after the restore, and every event it emits, has a higher
//     index than anything before it;
//   - the clock never goes back: the tick is the later of the two, and the
//     file's deadlines move with it, so that its leases and sessions keep
//     the remaining time they had when the file was saved;
//   - what is live before the restore stays as it is: every active lease
//     and session of cur is kept, record and fencing token unchanged, and
//     a key in use in cur (an active lease or a pending lock-delay) keeps
//     cur's state, so it stays held or blocked exactly as long as it would
//     have without the restore. A lease of the file on such a key, or bound
//     to a session active in cur, is not brought back: it is ended
//     (revoked, reason ReasonRestore);
//   - every other lease the file has active is active again with a new
//     fencing token, above every token issued before the restore (so no
//     token issued before the restore is ever valid again on a lease that
//     was not live just before it), in the order of its old tokens; the
//     fencing counter is above all of them, so a lease granted after the
//     restore gets a higher token still;
//   - the member registry is cur's: like Raft's configuration, membership
//     is the cluster's as it is now, never what it was at backup time;
//     so is the cluster identity (a backup restored into another cluster
//     does not make it the backup's cluster);
//   - every queued acquire (wait_ms), the file's and cur's, is withdrawn:
//     whoever sent the file's stopped waiting long ago, and cur's are
//     failed by the node that restores.
//
// cur is only read. The decision depends on f and cur alone, so it is
// deterministic: every replica, applying the same commit to the same
// state, reaches the same result.
func (f *FSM) Rebase(cur *FSM, index uint64) int {
	return f.RebaseStats(cur, index).DroppedWaits
}

// RebaseStats is Rebase, saying what it did.
func (f *FSM) RebaseStats(cur *FSM, index uint64) RebaseStats { return f.RebaseAbove(cur, index, 0) }

// RebaseAbove is RebaseStats with a fence floor: the new tokens and the
// fencing counter are also above floor (RestoreCommit.FenceFloor; 0: none).
func (f *FSM) RebaseAbove(cur *FSM, index, floor uint64) RebaseStats {
	r := newRebaser(f, cur)
	r.floor = floor
	r.sessionsMerged()
	r.leasesMerged()
	r.sessionsBound()
	r.install(index, r.keysMerged())
	return r.st
}

// rebaser holds what Rebase builds, step by step: f is the file's state
// (its records are changed in place), cur the running one (only read).
type rebaser struct {
	f, cur *FSM
	st     RebaseStats
	tick   uint64 // the later of the two clocks
	sf, sc uint64 // how far f's and cur's ticks move to reach it
	wallMS int64
	fence  uint64
	floor  uint64 // a fence floor (RestoreCommit.FenceFloor)
	// curKeys are the keys in use in cur (an active lease or a pending
	// lock-delay); curSess the sessions active in cur.
	curKeys, curSess map[string]bool
	sessions         map[string]*Session
	leases           map[string]*Lease
}

func newRebaser(f, cur *FSM) *rebaser {
	tick := max(f.tick, cur.tick)
	r := &rebaser{f: f, cur: cur, tick: tick, sf: tick - f.tick, sc: tick - cur.tick, wallMS: max(f.wallMS, cur.wallMS),
		curKeys: make(map[string]bool), curSess: make(map[string]bool)}
	r.st.TickShift = r.sf
	for ks := range cur.keys.All() {
		k := ks.key
		live := len(ks.active()) > 0
		for _, b := range ks.blocked() {
			live = live || b.Until > cur.tick
		}
		if live {
			r.curKeys[k] = true
		}
	}
	return r
}

// sessionsMerged: the file's sessions, then every session active in cur
// as it is.
func (r *rebaser) sessionsMerged() {
	r.sessions = make(map[string]*Session, len(r.f.sessions))
	for id, s := range r.f.sessions {
		r.sessions[id] = shiftSession(s, r.sf)
	}
	for id, s := range r.cur.sessions {
		switch {
		case s.State == SessionActive:
			r.sessions[id] = shiftSession(s, r.sc)
			r.curSess[id] = true
		case r.sessions[id] == nil:
			r.sessions[id] = shiftSession(s, r.sc) // ended, and unknown to the file
		}
	}
}

// leasesMerged: the file's leases, shifted; those active are brought back
// with a new token or ended; then every lease active in cur as it is.
func (r *rebaser) leasesMerged() {
	r.leases = make(map[string]*Lease, r.f.leases.Len()+r.cur.active)
	var back []*Lease
	for l := range r.f.leases.All() {
		id := l.ID
		nl := shiftLease(l, r.sf, true) // f's own records: changed in place
		r.leases[id] = nl
		if l.State != StateActive {
			continue
		}
		if c := r.cur.leases.Get(id); c != nil && c.State == StateActive {
			continue // replaced by cur's record below
		}
		if r.curKeys[l.Key] || l.SessionID != "" && r.curSess[l.SessionID] {
			nl.markEnded(StateRevoked, ReasonRestore, r.tick, r.wallMS)
			r.st.Superseded++
			continue
		}
		back = append(back, nl)
	}
	back = r.wholeGroups(back)
	slices.SortFunc(back, func(a, b *Lease) int { return cmp.Or(cmp.Compare(a.Fence, b.Fence), strings.Compare(a.ID, b.ID)) })
	r.fence = max(r.f.fence, r.cur.fence, r.floor)
	for _, l := range back {
		r.fence++
		l.Fence = r.fence
	}
	r.st.Refenced = len(back)
	for l := range r.cur.leases.All() {
		id := l.ID
		switch {
		case l.State == StateActive:
			r.leases[id] = shiftLease(l, r.sc, false)
			r.st.Kept++
		case r.leases[id] == nil:
			// Ended before the restore and unknown to the file: it stays
			// ended (a renew says so) until it is pruned.
			r.leases[id] = shiftLease(l, r.sc, false)
		}
	}
}

// sessionsBound: a session of the file keeps only the leases brought
// back, and every active lease bound to an active session is on its list
// (a lease not on it would outlive the session's end, with no timer to end
// it); an active lease whose session is not active ends, as the session's
// end would have ended it.
func (r *rebaser) sessionsBound() {
	bound := make(map[string][]string)
	for _, id := range sortedKeys(r.leases) {
		if l := r.leases[id]; l.State == StateActive && l.SessionID != "" {
			bound[l.SessionID] = append(bound[l.SessionID], id)
		}
	}
	for id, s := range r.sessions {
		if s.State != SessionActive {
			continue
		}
		ids := slices.DeleteFunc(slices.Clone(s.LeaseIDs), func(lid string) bool {
			l := r.leases[lid]
			return l == nil || l.State != StateActive || l.SessionID != id
		})
		for _, lid := range bound[id] {
			if !slices.Contains(ids, lid) {
				ids = append(ids, lid)
			}
		}
		if !slices.Equal(ids, s.LeaseIDs) {
			ns := *s
			ns.LeaseIDs = ids
			r.sessions[id] = &ns
		}
	}
	for _, l := range r.leases {
		if l.State != StateActive || l.SessionID == "" {
			continue
		}
		if s := r.sessions[l.SessionID]; s == nil || s.State != SessionActive {
			if c := r.cur.leases.Get(l.ID); c == l {
				cp := *l // cur's record, shared: never changed in place
				l = &cp
				r.leases[l.ID] = l
			}
			l.markEnded(StateExpired, ReasonSessionEnded, r.tick, r.wallMS)
		}
	}
}

// keysMerged: cur's state for the keys in use before, the file's for the
// others; no waiters; stolen ids only of leases still there. The keys with
// something left on them, sorted.
func (r *rebaser) keysMerged() []keyRec {
	keys := make(map[string]*keyState, r.f.keys.Len()+len(r.curKeys))
	for ks := range r.f.keys.All() {
		k := ks.key
		if !r.curKeys[k] {
			keys[k] = copyKey(k, ks, r.sf, r.f.tick, &r.st.DroppedWaits)
		} else {
			r.st.DroppedWaits += ks.nWaiters()
		}
	}
	var curWaits int // failed by the node that restores
	for k := range r.curKeys {
		keys[k] = copyKey(k, r.cur.keys.Get(k), r.sc, r.cur.tick, &curWaits)
	}
	activeOn := make(map[string]bool)
	for _, l := range r.leases {
		if l.State == StateActive {
			activeOn[l.Key] = true
		}
	}
	recs := make([]keyRec, 0, len(keys))
	for k, ks := range keys {
		if m := ks.more; m != nil {
			m.stolen = slices.DeleteFunc(m.stolen, func(id string) bool {
				l := r.leases[id]
				return l == nil || l.State == StateActive
			})
			ks.tidy()
		}
		if !activeOn[k] && ks.more == nil {
			continue // nothing left on the key
		}
		recs = append(recs, keyRec{key: k, ks: ks})
	}
	slices.SortFunc(recs, func(a, b keyRec) int { return strings.Compare(a.key, b.key) })
	return recs
}

// install derives every index from the merged records and makes them f's
// state, at log index index, with cur's member registry and identity.
func (r *rebaser) install(index uint64, recs []keyRec) {
	f, cur := r.f, r.cur
	n := New()
	n.index, n.tick, n.periodMS, n.wallMS, n.fence = index, r.tick, cmp.Or(f.periodMS, cur.periodMS), r.wallMS, r.fence
	n.keys.reserve(len(recs))
	for _, kr := range recs {
		n.keys.Put(kr.ks)
	}
	n.sessions = r.sessions
	sortedSessions := make([]*Session, 0, len(r.sessions))
	for _, id := range sortedKeys(r.sessions) {
		sortedSessions = append(sortedSessions, r.sessions[id])
	}
	sortedLeases := make([]*Lease, 0, len(r.leases))
	for _, id := range sortedKeys(r.leases) {
		sortedLeases = append(sortedLeases, r.leases[id])
	}
	if err := (rebuilder{n}).rebuild(recs, sortedSessions, sortedLeases, nil); err != nil {
		// Every active lease is on a key of recs, by construction.
		panic("fsm: rebase: " + err.Error())
	}
	n.members = maps.Clone(cur.members)
	if n.members == nil {
		n.members = make(map[string]MemberRecord)
	}
	// Only what the rebase rebuilt is replaced: any other part of the
	// state stays f's.
	f.index, f.tick, f.periodMS, f.wallMS, f.fence = n.index, n.tick, n.periodMS, n.wallMS, n.fence
	f.leases, f.sessions, f.keys, f.idem, f.waiting = n.leases, n.sessions, n.keys, n.idem, n.waiting
	f.order, f.sessIDs, f.holders, f.buckets, f.prune = n.order, n.sessIDs, n.holders, n.buckets, n.prune
	f.backlog, f.pruneSorted = n.backlog, 0
	f.members, f.active, f.sessOpen = n.members, n.active, n.sessOpen
	f.holderWaits, f.keyIdx = n.holderWaits, n.keyIdx
	f.groups, f.groupWaits = n.groups, n.groupWaits
	f.clusterID, f.sealCheck = cur.clusterID, cur.sealCheck
	f.features = cur.features // what this cluster's servers read (features.go)
	f.events, f.notices = f.events[:0], nil
}

// copyKey copies a key's limit, pending lock-delays (moved by shift ticks;
// those already over at tick now are left out) and stolen ids, without its
// active ids (rebuild adds them) and waiters (counted in dropped).
func copyKey(key string, ks *keyState, shift, now uint64, dropped *int) *keyState {
	n := &keyState{key: key, limit: ks.limit}
	m := ks.more
	if m == nil {
		return n
	}
	*dropped += m.waitq.len()
	var bl []blocked
	for _, b := range m.blocked {
		if b.Until > now {
			bl = append(bl, blocked{Until: b.Until + shift, LeaseID: b.LeaseID})
		}
	}
	if len(bl) > 0 || len(m.stolen) > 0 {
		n.more = &keyMore{blocked: bl, stolen: slices.Clone(m.stolen)}
	}
	return n
}

// shiftLease moves l's ticks by d: in place if own (a record of the
// decoded file, which nothing else shares), else in a copy when d moves
// anything. (Records are copy-on-write: a record that stays as it is may be
// shared with the running state.)
func shiftLease(l *Lease, d uint64, own bool) *Lease {
	nl := l
	if !own {
		if d == 0 {
			return l
		}
		c := *l
		nl = &c
	}
	if d == 0 {
		return nl
	}
	if nl.ExpiresTick != 0 {
		nl.ExpiresTick += d
	}
	nl.AcquiredTick += d
	if nl.EndedTick() != 0 || nl.State != StateActive {
		nl.setCold(func(c *leaseCold) { c.endedTick += d })
	}
	return nl
}

func shiftSession(s *Session, d uint64) *Session {
	ns := *s
	if d == 0 {
		return &ns
	}
	ns.ExpiresTick += d
	if ns.State != SessionActive {
		ns.EndedTick += d
	}
	return &ns
}
