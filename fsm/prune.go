package fsm

import "slices"

// Chunked pruning. A tick whose PruneMax is set prunes at most that many
// ended records (RetainTicks and RetainMax together); the rest stay in the
// prune queue for the next ticks, which take them first. So the records of
// a storm of 100,000 expiries, one retention period later, are pruned a
// chunk a tick instead of in one entry that holds every write behind it.
//
// The cut must fall at the same record on every replica. Within one tick,
// a replica that applied the log lists the records it ended in the order
// they ended, and a replica restored from a snapshot by kind and id
// (snapshot_rebuild.go). So before a limited tick prunes any record of a
// tick, it puts the rest of that tick's records in (kind, id) order; it
// only does so for a tick that is over (nothing more can end in it), so
// both replicas then hold the same list. Only records actually pruned
// count towards the limit: an entry of the queue whose record is gone,
// active again or ended at another tick prunes nothing, wherever a
// replica's queue came from.

// TypeTickPruned is a Tick whose PruneMax is set: a TypeTickLimited body
// followed by PruneMax (value part of the log format). A Tick without it
// keeps its type and bytes.
const TypeTickPruned Type = 29

// pruneBeforeN prunes, in order, the records that ended at least retain
// ticks ago (none when retain is 0), at most max of them, and returns how
// many more of max are left.
func (e *expiry) pruneBeforeN(retain, max uint64) uint64 {
	for retain > 0 && max > 0 && len(e.prune) > 0 && e.prune[0].tick+retain <= e.tick {
		if e.pruneFront() {
			max--
		}
	}
	return max
}

// pruneOverN prunes, in order, the records that ended first until at most
// keep are listed, at most max of them, and never one that ended at the
// current tick: that tick is not over, and only a tick that is over has
// the same order on every replica. So a tick that ends more records than
// keep leaves them all until the next tick.
func (e *expiry) pruneOverN(keep, max uint64) {
	for max > 0 && uint64(len(e.prune)) > keep && e.prune[0].tick < e.tick {
		if e.pruneFront() {
			max--
		}
	}
}

// pruneFront takes the first record off the prune queue, whose tick must
// be over, prunes it and reports whether it did (it had not been already).
func (e *expiry) pruneFront() bool {
	if e.pruneSorted == 0 {
		e.sortPruneFront()
	}
	p := e.prune[0]
	e.prune[0] = pruneItem{}
	e.prune = e.prune[1:]
	e.pruneSorted--
	if len(e.prune) == 0 {
		e.prune, e.pruneSorted = nil, 0
	}
	switch p.kind {
	case kindLease:
		if l := e.lb.leases.Get(p.id); l == nil || !l.Terminal() || l.EndedTick() != p.tick {
			return false
		}
		e.lb.pruneLease(p.id)
	case kindSession:
		if s := e.sess.sessions[p.id]; s == nil || s.State == SessionActive || s.EndedTick != p.tick {
			return false
		}
		e.sess.pruneSession(p.id)
	default:
		return false
	}
	return true
}

// sortPruneFront puts the records of the first tick in the prune queue in
// (kind, id) order, the order a restored replica lists them in, and notes
// how many they are.
func (e *expiry) sortPruneFront() {
	t := e.prune[0].tick
	n := 1
	for n < len(e.prune) && e.prune[n].tick == t {
		n++
	}
	e.pruneSorted = n
	group := e.prune[:n]
	if slices.IsSortedFunc(group, pruneLess) {
		return
	}
	ts := make([]timer, n)
	for i, p := range group {
		ts[i] = timer{kind: p.kind, id: p.id}
	}
	sortTimers(ts)
	for i, tm := range ts {
		group[i] = pruneItem{tick: t, kind: tm.kind, id: tm.id}
	}
}

// pruneLess orders the records of one tick: by kind, then id.
func pruneLess(a, b pruneItem) int {
	return timerLess(timer{kind: a.kind, id: a.id}, timer{kind: b.kind, id: b.id})
}
