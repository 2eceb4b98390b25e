package fsm

import (
	"cmp"
	"slices"

	"github.com/leasehold/leasehold/wire"
)

// endOpts says how a lease ends.
type endOpts struct {
	state  State
	reason string
	wallMS int64
	delay  bool // apply the lease's lock-delay and remember it as stolen
	// midTick: the end is applied between two ticks (a revoke), not by a
	// tick; its lock-delay counts from the next tick boundary.
	midTick bool
	session bool // ended with its session: the session record keeps the id
}

// withoutID returns ids without id (which it holds at most once) and
// leaves ids as it was: older versions of a session, which events and
// answers may still hold, share its array. The first or the last id goes
// without a copy (a session's leases released in the order they were
// granted, or the reverse), so that releasing all n leases of a session is
// not O(n²); another is removed from a copy.
func withoutID(ids []string, id string) []string {
	switch n := len(ids); {
	case n > 0 && ids[0] == id:
		// Appending to the rest writes past the end of every older
		// version, as a grant's append always does.
		return ids[1:]
	case n > 0 && ids[n-1] == id:
		// No room left: the next append copies instead of overwriting
		// the id that older versions still read there.
		return ids[: n-1 : n-1]
	}
	i := slices.Index(ids, id)
	if i < 0 {
		return ids
	}
	out := make([]string, 0, len(ids)-1)
	return append(append(out, ids[:i]...), ids[i+1:]...)
}

// end moves an active lease to a terminal state and frees its slot.
func (lb *leaseBook) end(l *Lease, o endOpts) *Lease {
	nl := l.endedCopy(o.state, o.reason, lb.tick, o.wallMS)
	lb.leases.Put(nl)
	lb.active--
	ks := lb.keys.Get(l.Key)
	lb.removeActive(ks, l)
	if hi := lb.holders[l.Holder]; hi != nil {
		hi.leases.remove(l.ID)
		lb.dropHolder(l.Holder)
	}
	if l.SessionID != "" && !o.session {
		lb.sess.unbindLease(l.SessionID, l.ID)
	}
	lb.exp.ended(kindLease, l.ID)
	if o.delay {
		ks.addStolen(l.ID)
		if d := l.LockDelayTicks(); d > 0 {
			until := lb.tick + d
			if o.midTick {
				// The next tick may commit right after this entry, and
				// one tick may follow another at once after a stall:
				// counting from the next boundary keeps the slot
				// blocked for the whole delay after the revoke is
				// acknowledged (DESIGN.md).
				until++
			}
			ks.ext().blocked = append(ks.blocked(), blocked{Until: until, LeaseID: l.ID})
			lb.exp.schedule(until, kindDelay, l.Key)
		}
	}
	typ := EventReleased
	switch o.state {
	case StateExpired:
		typ = EventExpired
	case StateRevoked:
		typ = EventRevoked
	}
	lb.emit(Event{Type: typ, WallMS: o.wallMS, Key: l.Key, Lease: nl, Reason: o.reason})
	lb.pump(l.Key, ks)
	return nl
}

// removeActive takes l out of the active ids of its key. They are in fence
// order, so a long list (a semaphore's) is searched by fence rather than
// scanned.
func (lb *leaseBook) removeActive(ks *keyState, l *Lease) {
	a := ks.active()
	i := -1
	if len(a) > 16 {
		j, _ := slices.BinarySearchFunc(a, l.Fence, func(id string, fence uint64) int {
			return cmp.Compare(lb.leases.Get(id).Fence, fence)
		})
		if j < len(a) && a[j] == l.ID {
			i = j
		}
	}
	if i < 0 {
		if i = slices.Index(a, l.ID); i < 0 {
			return
		}
	}
	ks.removeActiveAt(i)
}

func (lb *leaseBook) release(c *Release) Result {
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	l, err := lb.checkLease(c.LeaseID, c.TokenHash, c.SessionTokenHash)
	if err != nil {
		return Result{Err: err}
	}
	if g := l.GroupID(); g != "" {
		return Result{Err: InvalidField("lease_id", "lease %s is a member of lease group %s: release the group", c.LeaseID, g)}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonReleased)
	if canaryFenceReset {
		lb.fence = l.Fence - 1
	}
	if canaryFenceRepeat {
		if lb.canaryReleased == nil {
			lb.canaryReleased = map[string]uint64{}
		}
		lb.canaryReleased[l.Key] = l.Fence
	}
	return Result{Lease: lb.end(l, endOpts{state: StateReleased, reason: reason, wallMS: c.WallMS})}
}

func (lb *leaseBook) revoke(c *Revoke) Result {
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	if err := validID("lease_id", c.LeaseID); err != nil {
		return Result{Err: err}
	}
	l := lb.leases.Get(c.LeaseID)
	if l == nil {
		return Result{Err: Errorf(wire.CodeLeaseNotFound, "lease %s not found", c.LeaseID)}
	}
	if l.Terminal() {
		return Result{Err: terminalError(l)}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonRevoked)
	o := endOpts{state: StateRevoked, reason: reason, wallMS: c.WallMS, delay: true, midTick: true}
	if g := l.GroupID(); g != "" {
		res, _ := lb.grp.endGroup(g, l.ID, o) // a group ends whole
		return res
	}
	return Result{Lease: lb.end(l, o)}
}

func (lb *leaseBook) releaseHolder(c *ReleaseHolder) Result {
	if err := ValidHolder(c.Holder); err != nil {
		return Result{Err: err}
	}
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonHolderReleased)
	n := lb.dropWaitersOf(c.Holder)
	hi := lb.holders[c.Holder]
	if hi == nil {
		return Result{Count: n}
	}
	for _, id := range hi.leases.ids() {
		lb.end(lb.leases.Get(id), endOpts{state: StateRevoked, reason: reason, wallMS: c.WallMS})
		n++
	}
	for _, id := range hi.sessions.ids() {
		lb.sess.endSession(lb.sess.Session(id), SessionEnded, reason, c.WallMS)
		n++
	}
	return Result{Count: n}
}
