package fsm

import "slices"

// applyTick advances the clock by one tick and does everything that falls
// due: expiries (in deadline order; within one tick, by kind then id, so that
// a replica restored from a snapshot processes them in the same order), wait
// timeouts, lock-delay ends, then pruning of terminal records. With
// ExpireMax set it does at most that many and leaves the rest in the
// backlog for Expire entries (expire.go); what an earlier tick left there
// comes first in the same order. With PruneMax set it prunes at most that
// many records (prune.go) and leaves the rest to the next ticks.
func (f *FSM) applyTick(c *Tick) {
	if c.Tick != f.tick+1 {
		return // a duplicate or stale tick: time never moves by more than one
	}
	f.tick = c.Tick
	f.wallMS = c.WallMS
	if f.periodMS == 0 {
		f.periodMS = c.PeriodMS
	}
	due := f.buckets[f.tick].timers()
	delete(f.buckets, f.tick)
	// Most due timers end something, with an event and a prune entry
	// each: make room once.
	n := len(due)
	if c.ExpireMax > 0 && c.ExpireMax < uint64(n) {
		n = int(c.ExpireMax)
	}
	f.events = slices.Grow(f.events, n)
	f.prune = slices.Grow(f.prune, n)
	sortTimers(due)
	f.backlog = mergeTimers(f.backlog, due)
	f.expireDue(c.ExpireMax, c.WallMS, false)
	if c.PruneMax > 0 {
		left := f.pruneBeforeN(c.RetainTicks, c.PruneMax)
		if c.RetainMax > 0 {
			f.pruneOverN(c.RetainMax, left)
		}
	} else {
		if c.RetainTicks > 0 {
			f.pruneBefore(c.RetainTicks)
		}
		if c.RetainMax > 0 {
			f.pruneOver(c.RetainMax)
		}
	}
	f.dropStaleStage()
}

// leaseDeadline is the tick whose commit expires standalone lease l: its
// nominal end plus GraceTicks (DESIGN.md has the bound this keeps).
func leaseDeadline(l *Lease) uint64 {
	if canaryEarlyExpiry {
		// Never at or before the tick it was granted in: a timer there
		// would never fire, and the lease would never end.
		return max(l.ExpiresTick-1, l.AcquiredTick+1)
	}
	return l.ExpiresTick + GraceTicks
}

// waitTimeout ends queued acquire id on key if its deadline has come, and
// reports whether it did.
func (lb *leaseBook) waitTimeout(key, id string) bool {
	ks := lb.keys.Get(key)
	w, ok := lb.findWaiter(key, id)
	if !ok || w.Deadline > lb.tick {
		return false
	}
	if w.group != "" {
		lb.grp.withdrawGroup(w.group, lb.grp.groupBusy(w.group))
		lb.grp.repumpKeys()
		return true
	}
	w, _ = lb.unqueue(ks, id)
	lb.dropWaiter(w.Cmd, id, lb.busyError(key, ks))
	lb.pump(key, ks)
	return true
}

// delayEnd ends the lock-delays on key whose time has come, and reports
// whether there were any.
func (lb *leaseBook) delayEnd(key string, wallMS int64) bool {
	ks := lb.keys.Get(key)
	if ks == nil {
		return false
	}
	var ended []blocked
	ks.ext().blocked = slices.DeleteFunc(slices.Clone(ks.blocked()), func(b blocked) bool {
		if b.Until <= lb.tick {
			ended = append(ended, b)
			return true
		}
		return false
	})
	for _, b := range ended {
		lb.emit(Event{Type: EventLockDelayEnded, WallMS: wallMS, Key: key, Reason: b.LeaseID})
	}
	lb.pump(key, ks)
	return len(ended) > 0
}

// pruneBefore removes terminal leases and sessions that ended at least
// retain ticks ago. Pruning never touches the fence counter.
func (e *expiry) pruneBefore(retain uint64) {
	n := 0
	for _, p := range e.prune {
		if p.tick+retain > e.tick {
			break
		}
		n++
		e.pruneOne(p)
	}
	if n > 0 {
		e.prune = e.prune[n:]
		e.pruneSorted = 0
	}
}

// pruneOver removes the terminal leases and sessions that ended first
// until at most max are kept. It removes whole ticks' worth: records that
// ended in the same tick are listed in f.prune in the order they ended on
// a replica that applied them but by kind and id on one restored from a
// snapshot, so only a cut between ticks is the same on every replica.
func (e *expiry) pruneOver(max uint64) {
	if uint64(len(e.prune)) <= max {
		return
	}
	n := len(e.prune) - int(max)
	for last := e.prune[n-1].tick; n < len(e.prune) && e.prune[n].tick == last; {
		n++
	}
	for _, p := range e.prune[:n] {
		e.pruneOne(p)
	}
	clear(e.prune[:n])
	e.prune = e.prune[n:]
	e.pruneSorted = 0
}

func (e *expiry) pruneOne(p pruneItem) {
	switch p.kind {
	case kindLease:
		e.lb.pruneLease(p.id)
	case kindSession:
		e.sess.pruneSession(p.id)
	}
}

// pruneLease forgets ended lease id: its record and every index that
// still names it.
func (lb *leaseBook) pruneLease(id string) {
	l := lb.leases.Get(id)
	if l == nil || !l.Terminal() {
		return
	}
	lb.leases.Delete(id)
	lb.order.remove(id)
	lb.keyIdx.drop(l.Key)
	lb.forgetIdem(l.idemHash(), l.ID)
	if g := l.GroupID(); g != "" {
		lb.grp.dropGroupMember(g, l.ID)
	}
	if ks := lb.keys.Get(l.Key); ks != nil {
		if m := ks.more; m != nil && len(m.stolen) > 0 {
			if m.stolen[0] == l.ID {
				// Leases are pruned in about the order they
				// ended, which is the order they were stolen in.
				m.stolen[0] = ""
				m.stolen = m.stolen[1:]
			} else {
				m.stolen = slices.DeleteFunc(m.stolen, func(id string) bool { return id == l.ID })
			}
		}
		lb.dropKey(l.Key, ks)
	}
}
