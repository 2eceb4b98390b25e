package fsm

import "github.com/leasehold/leasehold/wire"

// queueWaiter appends w to the queue of its key and sets its deadline's
// timer.
func (lb *leaseBook) queueWaiter(ks *keyState, w waiter) {
	c := w.Cmd
	ks.ext().waitq.push(w)
	lb.waiting[c.LeaseID] = c.Key
	hw := lb.holderWaits[c.Holder]
	if hw == nil {
		hw = make(map[string]string)
		lb.holderWaits[c.Holder] = hw
	}
	hw[c.LeaseID] = c.Key
	lb.exp.schedule(w.Deadline, kindWait, c.Key+"\x00"+c.LeaseID)
}

// unqueue withdraws the queued acquire id from the queue of ks and from the
// indexes (not from the idempotency map). It does not tidy the key.
func (lb *leaseBook) unqueue(ks *keyState, id string) (waiter, bool) {
	if ks == nil || ks.more == nil {
		return waiter{}, false
	}
	w, ok := ks.more.waitq.remove(id)
	if !ok {
		return waiter{}, false
	}
	delete(lb.waiting, id)
	if hw := lb.holderWaits[w.Cmd.Holder]; hw != nil {
		delete(hw, id)
		if len(hw) == 0 {
			delete(lb.holderWaits, w.Cmd.Holder)
		}
	}
	return w, true
}

// findWaiter returns the queued acquire id on key.
func (lb *leaseBook) findWaiter(key, id string) (waiter, bool) {
	ks := lb.keys.Get(key)
	if ks == nil || ks.more == nil {
		return waiter{}, false
	}
	return ks.more.waitq.find(id)
}

// pump grants queued acquires on key while slots are free, then forgets the
// key if nothing refers to it any more.
func (lb *leaseBook) pump(key string, ks *keyState) {
	for ks.free() > 0 && ks.nWaiters() > 0 {
		w := ks.more.waitq.front()
		if w.group != "" {
			// A lease group: granted only at the head of every one of
			// its keys' queues, and until then it holds this queue up.
			if !lb.grp.pumpGroup(w.group) {
				break
			}
			continue
		}
		lb.unqueue(ks, w.Cmd.LeaseID)
		c := w.Cmd
		sess, err := lb.stillGrantable(c, c.LeaseID)
		if err != nil {
			lb.dropWaiter(c, c.LeaseID, err)
			continue
		}
		l := lb.grant(c, ks, sess, "")
		lb.notices = append(lb.notices, Notice{LeaseID: c.LeaseID, Lease: l})
	}
	lb.dropKey(key, ks)
	lb.grp.repumpKeys()
}

// stillGrantable checks that queued acquire c (of a lease group: its
// first member, ids being the group's lease ids) can still be granted now
// that it leaves its queues, and returns its session: no lease took one of
// its ids meanwhile (acquire only sees waiters on its own key, so an id may
// have been granted on another key: never grant it twice), and its
// session, if any, is still active.
func (lb *leaseBook) stillGrantable(c *Acquire, ids ...string) (*Session, *wire.Error) {
	for _, id := range ids {
		if lb.leases.Has(id) {
			return nil, InvalidField("lease_id", "lease id %s already exists", id)
		}
	}
	if c.SessionID == "" {
		return nil, nil
	}
	return lb.sess.checkSession(c.SessionID, c.SessionTokenHash)
}

// dropWaiter forgets the idempotency record of withdrawn queued acquire c
// (a lease group's first member) and tells its proposer err under name
// (its lease id or its group's); nil: nobody listens any more.
func (lb *leaseBook) dropWaiter(c *Acquire, name string, err *wire.Error) {
	lb.forgetIdem(c.IdemHash, c.LeaseID)
	if err != nil {
		lb.notices = append(lb.notices, Notice{LeaseID: name, Err: err})
	}
}

func (lb *leaseBook) dropKey(key string, ks *keyState) {
	ks.tidy()
	if !ks.inUse() && len(ks.stolen()) == 0 {
		lb.keys.Delete(key)
	}
}

// dropWaitersOf withdraws every queued acquire of holder (directly or
// through one of its sessions), so that ending its leases cannot hand it a
// new one; each waiter is told with a notice. It returns how many it
// withdrew.
func (lb *leaseBook) dropWaitersOf(holder string) int {
	hw := lb.holderWaits[holder]
	ids := sortedKeys(hw)
	n := 0
	for _, id := range ids {
		key := hw[id]
		ks := lb.keys.Get(key)
		if w, ok := lb.findWaiter(key, id); ok && w.group != "" {
			// Its keys are pumped once every waiter of the holder is
			// gone, so that none of them is granted meanwhile.
			lb.grp.withdrawGroup(w.group, Errorf(wire.CodeLeaseRevoked, "all leases of holder %s were released while this lease group waited", holder))
			n++
			continue
		}
		w, ok := lb.unqueue(ks, id)
		if !ok {
			continue
		}
		lb.dropWaiter(w.Cmd, id, Errorf(wire.CodeLeaseRevoked, "all leases of holder %s were released while this acquire waited", holder))
		lb.dropKey(key, ks)
		n++
	}
	lb.grp.repumpKeys()
	return n
}

func (lb *leaseBook) cancelWait(c *CancelWait) {
	ks := lb.keys.Get(c.Key)
	if ks == nil {
		return
	}
	if w, ok := lb.findWaiter(c.Key, c.LeaseID); ok && w.group != "" {
		lb.grp.withdrawGroup(w.group, nil) // any member names the whole group
		lb.grp.repumpKeys()
		return
	}
	if w, ok := lb.unqueue(ks, c.LeaseID); ok {
		lb.forgetIdem(w.Cmd.IdemHash, c.LeaseID)
		lb.pump(c.Key, ks)
	}
}
