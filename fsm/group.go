package fsm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/leasehold/leasehold/wire"
)

// Lease groups: several keys taken at once, all or nothing.
//
// An AcquireGroup names 1-MaxGroupKeys distinct keys (in increasing
// order), each with its own limit and lease id, and everything else once.
// Applied, it either grants one lease per key, each with its own fencing
// token, or changes nothing and answers why (LIMIT_MISMATCH, or LEASE_HELD
// / LOCK_DELAY naming the first busy key in key order and its holders).
// The members are ordinary leases with the group's id and one shared
// token; a member is renewed and released only through its group, and
// whatever ends one member ends them all in the same entry. A group that
// waits is one waiter on each of its keys, granted when it heads every
// queue with a free slot; while it heads a queue nothing behind it is
// granted on that key (no starvation, no deadlock). DESIGN.md, "Lease
// groups", gives the reasoning.
//
// These commands are types of their own, written only once every server
// of the configuration reads them (the node checks gossip).

// Command types of lease groups (values are part of the log format).
const (
	TypeAcquireGroup Type = 23
	TypeRenewGroup   Type = 24
	TypeReleaseGroup Type = 25
)

// MaxGroupKeys bounds the keys of one lease group.
const MaxGroupKeys = 64

// GroupKey is one key of an AcquireGroup: the key, its limit (as in
// Acquire) and the id of the lease it is to get.
type GroupKey struct {
	LeaseID string `json:"lease_id"`
	Key     string `json:"key"`
	Limit   uint32 `json:"limit"`
}

// AcquireGroup asks for a lease on each of several keys at once, all or
// nothing. The fields after Keys mean what they mean in Acquire and apply
// to every member; the idempotency fields belong to the group (they are
// kept with its first member).
type AcquireGroup struct {
	GroupID          string            `json:"group_id"`
	Keys             []GroupKey        `json:"keys"`
	Holder           string            `json:"holder"`
	SessionID        string            `json:"session_id,omitempty"`
	SessionTokenHash Hash              `json:"session_token_hash,omitzero"`
	TokenHash        Hash              `json:"token_hash"`
	TTLMS            int64             `json:"ttl_ms,omitempty"`
	TTLTicks         uint64            `json:"ttl_ticks,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	IdemHash         Hash              `json:"idem_hash,omitzero"`
	Fingerprint      Hash              `json:"fingerprint,omitzero"`
	SealedToken      []byte            `json:"sealed_token,omitempty"`
	WaitTicks        uint64            `json:"wait_ticks,omitempty"`
	LockDelayMS      int64             `json:"lock_delay_ms,omitempty"`
	LockDelayTicks   uint64            `json:"lock_delay_ticks,omitempty"`
	WallMS           int64             `json:"wall_ms"`
	Quota            Quota             `json:"quota,omitzero"`
}

// RenewGroup renews every member of a standalone lease group, as Renew
// renews one lease.
type RenewGroup struct {
	GroupID   string `json:"group_id"`
	TokenHash Hash   `json:"token_hash"`
	TTLMS     int64  `json:"ttl_ms,omitempty"`
	TTLTicks  uint64 `json:"ttl_ticks,omitempty"`
	WallMS    int64  `json:"wall_ms"`
}

// ReleaseGroup releases every member of a lease group, as Release
// releases one lease (SessionTokenHash may stand in for the group's token
// when the group is bound to a session).
type ReleaseGroup struct {
	GroupID          string `json:"group_id"`
	TokenHash        Hash   `json:"token_hash,omitzero"`
	SessionTokenHash Hash   `json:"session_token_hash,omitzero"`
	Reason           string `json:"reason,omitempty"`
	WallMS           int64  `json:"wall_ms"`
}

func (*AcquireGroup) Type() Type { return TypeAcquireGroup }
func (*RenewGroup) Type() Type   { return TypeRenewGroup }
func (*ReleaseGroup) Type() Type { return TypeReleaseGroup }

// groupBook owns the lease groups: which leases are the members of each
// granted group and which waiters each queued group has (both derived
// from the lease and key records), and the keys a group's grant or
// withdrawal left to pump again. Members are ordinary leases of the
// leaseBook (lb): a group is granted, renewed and ended through its
// single-lease code paths.
type groupBook struct {
	*core
	lb   *leaseBook
	sess *sessionBook

	// groups: id -> member lease ids in key order; groupWaits: id -> its
	// waiters, one per key in key order.
	groups     map[string][]string
	groupWaits map[string][]waiter
	// repump are keys whose queue a group grant or withdrawal changed,
	// to pump once the change is complete.
	repump    []string
	repumping bool
}

// GroupID is the id of the lease group l is a member of; "" for none.
func (l *Lease) GroupID() string {
	if l.idem == nil {
		return ""
	}
	return l.idem.group
}

// withGroup returns x with the group id g (x itself when g is "").
func withGroup(x *leaseIdem, g string) *leaseIdem {
	if g == "" {
		return x
	}
	if x == nil {
		return &leaseIdem{group: g}
	}
	c := *x
	c.group = g
	return &c
}

// member returns the Acquire of the i-th key; the idempotency fields go
// with the first.
func (c *AcquireGroup) member(i int) *Acquire {
	k := c.Keys[i]
	a := &Acquire{LeaseID: k.LeaseID, Key: k.Key, Holder: c.Holder, Limit: k.Limit, SessionID: c.SessionID,
		SessionTokenHash: c.SessionTokenHash, TokenHash: c.TokenHash, TTLMS: c.TTLMS, TTLTicks: c.TTLTicks,
		Metadata: c.Metadata, WaitTicks: c.WaitTicks, LockDelayMS: c.LockDelayMS, LockDelayTicks: c.LockDelayTicks,
		WallMS: c.WallMS, Quota: c.Quota}
	if i == 0 {
		a.IdemHash, a.Fingerprint, a.SealedToken = c.IdemHash, c.Fingerprint, c.SealedToken
	}
	return a
}

func validateGroup(c *AcquireGroup) *wire.Error {
	if err := validID("group_id", c.GroupID); err != nil {
		return err
	}
	if len(c.Keys) == 0 || len(c.Keys) > MaxGroupKeys {
		return InvalidField("keys", "a lease group takes 1-%d keys, got %d", MaxGroupKeys, len(c.Keys))
	}
	ids := make(map[string]bool, len(c.Keys))
	for i, k := range c.Keys {
		if i > 0 && k.Key <= c.Keys[i-1].Key {
			return InvalidField("keys", "the keys of a lease group must be distinct, in increasing order (%s after %s)", quote(k.Key), quote(c.Keys[i-1].Key))
		}
		if ids[k.LeaseID] {
			return InvalidField("lease_id", "lease id %s twice in one lease group", k.LeaseID)
		}
		ids[k.LeaseID] = true
		if err := validateAcquire(c.member(i)); err != nil {
			return err
		}
	}
	return nil
}

func (gb *groupBook) acquireGroup(c *AcquireGroup) Result {
	if err := validateGroup(c); err != nil {
		return Result{Err: err}
	}
	if id, ok := gb.lb.idemLease(c.IdemHash); ok {
		return gb.replayGroup(id, c)
	}
	if gb.groups[c.GroupID] != nil || gb.groupWaits[c.GroupID] != nil {
		return Result{Err: InvalidField("group_id", "lease group id %s already exists", c.GroupID)}
	}
	for _, k := range c.Keys {
		if err := gb.lb.idTaken(k.LeaseID); err != nil {
			return Result{Err: err}
		}
	}
	sess, holder, err := gb.sess.bind(c.SessionID, c.SessionTokenHash, c.Holder)
	if err != nil {
		return Result{Err: err}
	}
	if err := gb.lb.checkLeaseQuota(c.Quota, holder, len(c.Keys), true); err != nil {
		return Result{Err: err}
	}
	// Every key must agree on its limit; the group is granted now only if
	// every key has a free slot and nobody queued for it.
	busy, nBusy := -1, 0
	for i, k := range c.Keys {
		if err := gb.lb.limitMismatch(k.Key, k.Limit); err != nil {
			return Result{Err: err}
		}
		ks := gb.lb.keys.Get(k.Key)
		if ks == nil || !ks.inUse() {
			continue
		}
		if ks.free() <= 0 || ks.nWaiters() > 0 {
			if busy < 0 {
				busy = i
			}
			nBusy++
		}
	}
	if busy < 0 {
		cmds := make([]*Acquire, len(c.Keys))
		for i := range c.Keys {
			cmds[i] = c.member(i)
		}
		return Result{Leases: gb.grant(c.GroupID, cmds, sess, gb.lb.keyFor)}
	}
	if c.WaitTicks == 0 {
		k := c.Keys[busy].Key
		err := gb.lb.busyError(k, gb.lb.keys.Get(k))
		if nBusy > 1 {
			err.Message += " (" + itoa(uint64(nBusy)) + " of the lease group's " + itoa(uint64(len(c.Keys))) + " keys are busy)"
		}
		return Result{Err: err}
	}
	keys := make([]string, len(c.Keys))
	for i, k := range c.Keys {
		keys[i] = k.Key
	}
	if err := gb.lb.checkWaitQuota(c.Quota, holder, keys, true); err != nil {
		return Result{Err: err}
	}
	deadline := gb.tick + c.WaitTicks
	ws := make([]waiter, len(c.Keys))
	for i := range c.Keys {
		a := c.member(i)
		// Queued waiters name their holder (as acquire's do).
		a.Holder = holder
		w := waiter{Cmd: a, Deadline: deadline, group: c.GroupID}
		gb.lb.queueWaiter(gb.lb.keyFor(a), w)
		ws[i] = w
	}
	gb.groupWaits[c.GroupID] = ws
	gb.lb.rememberIdem(c.IdemHash, c.Keys[0].LeaseID)
	return Result{Queued: true, Leases: placeholders(c.GroupID, ws)}
}

// placeholders are the leases a queued group will get, as far as they are
// known: ids, keys, holder, group (and the sealed token, with the first).
func placeholders(g string, ws []waiter) []*Lease {
	out := make([]*Lease, len(ws))
	for i, w := range ws {
		out[i] = &Lease{ID: w.Cmd.LeaseID, Key: w.Cmd.Key, Holder: w.Cmd.Holder, Limit: uint16(w.Cmd.Limit),
			idem: withGroup(newLeaseIdem(Hash{}, Hash{}, w.Cmd.SealedToken), g)}
	}
	return out
}

// grant grants group g its members cmds (in key order, each key with a
// free slot, whose state keyOf returns), bound to session sess if not
// nil, through the single-lease grant, and returns them.
func (gb *groupBook) grant(g string, cmds []*Acquire, sess *Session, keyOf func(*Acquire) *keyState) []*Lease {
	members := make([]*Lease, len(cmds))
	ids := make([]string, len(cmds))
	for i, a := range cmds {
		members[i] = gb.lb.grant(a, keyOf(a), gb.sess.current(sess), g)
		ids[i] = a.LeaseID
	}
	gb.groups[g] = ids
	return members
}

// dequeue takes queued group g out of every one of its keys' queues and
// returns its waiters (nil if g is not queued); the keys are pumped by
// repumpKeys.
func (gb *groupBook) dequeue(g string) []waiter {
	ws := gb.groupWaits[g]
	if len(ws) == 0 {
		return nil
	}
	delete(gb.groupWaits, g)
	for _, w := range ws {
		gb.lb.unqueue(gb.lb.keys.Get(w.Cmd.Key), w.Cmd.LeaseID)
		gb.repump = append(gb.repump, w.Cmd.Key)
	}
	return ws
}

// replayGroup answers an idempotent group acquire whose idempotency hash
// names id, the first member of an earlier group (granted or queued).
func (gb *groupBook) replayGroup(id string, c *AcquireGroup) Result {
	conflict := idemConflict(id)
	if l := gb.lb.leases.Get(id); l != nil {
		if l.GroupID() == "" || l.fingerprint() != c.Fingerprint {
			return conflict
		}
		return Result{Leases: gb.Group(l.GroupID()), Replayed: true}
	}
	if w, ok := gb.lb.findWaiter(gb.lb.waiting[id], id); ok && w.group != "" && w.Cmd.Fingerprint == c.Fingerprint {
		return Result{Queued: true, Replayed: true, Leases: placeholders(w.group, gb.groupWaits[w.group])}
	}
	return conflict
}

// atHead reports whether w is first in its key's queue with a slot free.
func (gb *groupBook) atHead(w waiter) bool {
	ks := gb.lb.keys.Get(w.Cmd.Key)
	return ks != nil && ks.free() > 0 && ks.nWaiters() > 0 && ks.more.waitq.front().Cmd.LeaseID == w.Cmd.LeaseID
}

// pumpGroup grants queued group g if it is at the head of every one of its
// keys' queues with a free slot on each, or fails it there if it can no
// longer be granted (a member id taken meanwhile, its session gone). It
// reports whether g left the queues; the keys whose queues changed are
// pumped by repumpKeys.
func (gb *groupBook) pumpGroup(g string) bool {
	for _, w := range gb.groupWaits[g] {
		if !gb.atHead(w) {
			return false
		}
	}
	ws := gb.dequeue(g)
	first := ws[0].Cmd
	ids := make([]string, len(ws))
	cmds := make([]*Acquire, len(ws))
	for i, w := range ws {
		ids[i], cmds[i] = w.Cmd.LeaseID, w.Cmd
	}
	sess, err := gb.lb.stillGrantable(first, ids...)
	if err != nil {
		gb.lb.dropWaiter(first, g, err)
		return true
	}
	members := gb.grant(g, cmds, sess, func(a *Acquire) *keyState { return gb.lb.keys.Get(a.Key) })
	gb.notices = append(gb.notices, Notice{LeaseID: g, Lease: members[0], Leases: members})
	return true
}

// withdrawGroup takes queued group g out of every queue (its wait ended,
// was cancelled, or its holder was released) and tells its proposer err
// (nil: nobody listens any more). The caller then runs repumpKeys.
func (gb *groupBook) withdrawGroup(g string, err *wire.Error) {
	if ws := gb.dequeue(g); ws != nil {
		gb.lb.dropWaiter(ws[0].Cmd, g, err)
	}
}

// groupBusy explains why queued group g is not granted: the first of its
// keys without a free slot, or with other acquires queued ahead of it.
func (gb *groupBook) groupBusy(g string) *wire.Error {
	for _, w := range gb.groupWaits[g] {
		if !gb.atHead(w) {
			return gb.lb.busyError(w.Cmd.Key, gb.lb.keys.Get(w.Cmd.Key))
		}
	}
	return Errorf(wire.CodeLeaseHeld, "lease group %s was not granted within its wait", g)
}

// repumpKeys pumps the keys in f.repump, in order, until no group grant
// or withdrawal adds any more. Pumps it starts add to the list rather
// than nest.
func (gb *groupBook) repumpKeys() {
	if gb.repumping {
		return
	}
	gb.repumping = true
	for len(gb.repump) > 0 {
		k := gb.repump[0]
		gb.repump = gb.repump[1:]
		if ks := gb.lb.keys.Get(k); ks != nil {
			gb.lb.pump(k, ks)
		}
	}
	gb.repump = nil
	gb.repumping = false
}

// endGroup ends every active member of group g with o, in key order, and
// returns the group (Lease: member named, Leases: every member) and how
// many members it ended.
func (gb *groupBook) endGroup(g, named string, o endOpts) (Result, uint64) {
	var res Result
	n := uint64(0)
	for _, id := range gb.groups[g] {
		if l := gb.lb.leases.Get(id); l != nil && l.State == StateActive {
			gb.lb.end(l, o)
			n++
		}
	}
	res.Leases = gb.Group(g)
	res.Lease = gb.lb.leases.Get(named)
	return res, n
}

// groupMembers checks tok (or, for a bound group, sessTok) against every
// member of group g and returns them: all active and not due, or an error
// and nothing changes.
func (gb *groupBook) groupMembers(g string, tok, sessTok Hash) ([]*Lease, *wire.Error) {
	if err := validID("group_id", g); err != nil {
		return nil, err
	}
	ids := gb.groups[g]
	if len(ids) == 0 {
		return nil, Errorf(wire.CodeLeaseNotFound, "lease group %s not found", g)
	}
	out := make([]*Lease, len(ids))
	for i, id := range ids {
		l, err := gb.lb.checkLease(id, tok, sessTok)
		if err != nil {
			err.Message = "lease group " + g + ": " + err.Message
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}

func (gb *groupBook) renewGroup(c *RenewGroup) Result {
	if err := validRenewTTL(c.TTLMS, c.TTLTicks); err != nil {
		return Result{Err: err}
	}
	ls, err := gb.groupMembers(c.GroupID, c.TokenHash, Hash{})
	if err != nil {
		return Result{Err: err}
	}
	if s := ls[0].SessionID; s != "" {
		return Result{Err: InvalidField("group_id", "lease group %s is bound to session %s: heartbeat the session instead", c.GroupID, s)}
	}
	out := make([]*Lease, len(ls))
	for i, l := range ls {
		nl, err := gb.lb.renewOne(l.ID, c.TokenHash, renewal{ttlMS: c.TTLMS, ttlTicks: c.TTLTicks, wallMS: c.WallMS, group: true})
		if err != nil {
			panic(fmt.Sprintf("fsm: renewal of checked group member %s: %v", l.ID, err))
		}
		out[i] = nl
	}
	return Result{Leases: out}
}

func (gb *groupBook) releaseGroup(c *ReleaseGroup) Result {
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	ls, err := gb.groupMembers(c.GroupID, c.TokenHash, c.SessionTokenHash)
	if err != nil {
		return Result{Err: err}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonReleased)
	res, _ := gb.endGroup(c.GroupID, ls[0].ID, endOpts{state: StateReleased, reason: reason, wallMS: c.WallMS})
	res.Lease = nil
	return res
}

// dropGroupMember forgets pruned member id of group g.
func (gb *groupBook) dropGroupMember(g, id string) {
	ids := slices.DeleteFunc(gb.groups[g], func(x string) bool { return x == id })
	if len(ids) == 0 {
		delete(gb.groups, g)
		return
	}
	gb.groups[g] = ids
}

// Group returns the retained members of lease group id in key order, nil
// if it has none (unknown, pruned, or still queued).
func (gb *groupBook) Group(id string) []*Lease {
	ids := gb.groups[id]
	if len(ids) == 0 {
		return nil
	}
	out := make([]*Lease, len(ids))
	for i, x := range ids {
		out[i] = gb.lb.leases.Get(x)
	}
	return out
}

// GroupQueued reports whether lease group id is queued (wait_ms) for its
// keys.
func (gb *groupBook) GroupQueued(id string) bool { return len(gb.groupWaits[id]) > 0 }

// GroupHeldUp reports whether key has a free slot that a queued lease
// group at the head of its queue keeps (waiting for its other keys): the
// one case in which a key's queue is not empty while a slot is free.
func (gb *groupBook) GroupHeldUp(key string) bool {
	ks := gb.lb.keys.Get(key)
	if ks == nil || ks.free() <= 0 || ks.nWaiters() == 0 {
		return false
	}
	w := ks.more.waitq.front()
	return w.group != "" && slices.ContainsFunc(gb.groupWaits[w.group], func(m waiter) bool { return !gb.atHead(m) })
}

// rebuildGroups derives the group indexes from the records of a snapshot:
// the members of each group (sorted by key) and its queued waiters, which
// rebuild queued in key order.
func (n rebuilder) rebuildGroups(keys []keyRec, leases []*Lease) error {
	for _, l := range leases {
		if g := l.GroupID(); g != "" {
			n.groups[g] = append(n.groups[g], l.ID)
		}
	}
	for _, ids := range n.groups {
		slices.SortFunc(ids, func(a, b string) int { return strings.Compare(n.leases.Get(a).Key, n.leases.Get(b).Key) })
	}
	for _, k := range keys {
		for _, w := range k.waiters {
			if w.group == "" {
				continue
			}
			ws := n.groupWaits[w.group]
			if len(ws) > 0 && (ws[0].Deadline != w.Deadline || ws[0].Cmd.Holder != w.Cmd.Holder) {
				return fmt.Errorf("fsm: snapshot: lease group %s queued with different deadlines or holders", w.group)
			}
			if n.groups[w.group] != nil {
				return fmt.Errorf("fsm: snapshot: lease group %s both queued and granted", w.group)
			}
			n.groupWaits[w.group] = append(ws, w)
		}
	}
	return nil
}

// wholeGroups keeps a lease group of a restored file (Rebase) only whole:
// if any of its members is not brought back (its key or session was in
// use), none is; they end as revoked with reason ReasonRestore too.
func (r *rebaser) wholeGroups(back []*Lease) []*Lease {
	in := make(map[string]int) // group -> its members in back
	for _, l := range back {
		if g := l.GroupID(); g != "" {
			in[g]++
		}
	}
	if len(in) == 0 {
		return back
	}
	return slices.DeleteFunc(back, func(l *Lease) bool {
		g := l.GroupID()
		if g == "" || in[g] == len(r.f.groups[g]) {
			return false
		}
		l.markEnded(StateRevoked, ReasonRestore, r.tick, r.wallMS)
		r.st.Superseded++
		return true
	})
}
