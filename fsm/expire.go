package fsm

import (
	"cmp"
	"slices"
	"strings"
)

// Chunked expiry. A tick whose ExpireMax is set ends at most that many due
// records (leases, sessions, waiter timeouts, lock-delay ends); what is due
// and not yet done waits in the backlog, and the leader proposes Expire
// entries, each ending at most Max more, until it is empty. Client writes
// commit between them, so a storm of expiries never holds one up for long.
// Until its entry applies, a due lease keeps its slot (nothing new is
// granted on its key) and refuses renewal, release and heartbeats as
// expired (checkLease), so that nothing can tell it from an ended one but
// its key's occupancy.

// Command types of chunked expiry (values are part of the log format).
const (
	// TypeExpire is an Expire entry.
	TypeExpire Type = 16
	// TypeTickLimited is a Tick whose ExpireMax is set: a Tick's body
	// followed by ExpireMax. A Tick without it keeps type 2 and its
	// version-4 encoding.
	TypeTickLimited Type = 17
)

// Expire ends up to Max more of what the current tick left due (the
// backlog). Only the leader proposes it, right after a tick that left some.
type Expire struct {
	// Tick is the tick the backlog belongs to: an Expire of another tick
	// (stale, or from a deposed leader) is ignored.
	Tick uint64 `json:"tick"`
	// WallMS is the leader's wall clock, for display (ended_at).
	WallMS int64 `json:"wall_ms"`
	// Max bounds the records ended (at least 1).
	Max uint64 `json:"max"`
}

// Type implements Command.
func (*Expire) Type() Type { return TypeExpire }

// expiry owns time's consequences: the per-tick timer buckets, the
// backlog of due timers a limited tick left, and the queue of ended
// records to prune. It ends leases and sessions through their parts.
type expiry struct {
	*core
	lb   *leaseBook
	sess *sessionBook
	grp  *groupBook

	buckets map[uint64]*bucket
	// backlog holds the timers due at or before the current tick that a
	// limited tick or Expire has not processed yet, in processing order.
	// Empty between entries unless ticks are limited.
	backlog []timer
	// prune lists the ended records to prune, by the tick they ended
	// in; within a tick in the order they ended, or by kind and id on a
	// replica restored from a snapshot (prune.go).
	prune []pruneItem
	// pruneSorted is how many records at the front of prune are known
	// to be the rest of one tick's in (kind, id) order (prune.go).
	pruneSorted int
	// warmHits counts what warm found, so that its lookups are not
	// optimised away; nothing reads it.
	warmHits uint64
}

func (c *Expire) fields(f fields) {
	f.uvarint(&c.Tick)
	f.varint(&c.WallMS)
	f.uvarint(&c.Max)
	f.reject(c.Max == 0, "expire: max must be positive")
}

// bucket holds the timers set for one tick. A standalone lease's timer,
// most of them at a million leases, is its id alone (16 bytes; a timer
// with its kind takes 24): the kind is the list's.
type bucket struct {
	leases []string // kindLease timers' ids
	other  []timer  // every other kind's
}

// len is the number of timers in b.
func (b *bucket) len() int { return len(b.leases) + len(b.other) }

// timers returns b's timers, leases first (the caller sorts them).
func (b *bucket) timers() []timer {
	if b == nil {
		return nil
	}
	out := make([]timer, 0, b.len())
	for _, id := range b.leases {
		out = append(out, timer{kind: kindLease, id: id})
	}
	return append(out, b.other...)
}

// limitedMarker is the ExpireMax newBody gives a TypeTickLimited command,
// so that Tick.decode knows to read the field.
const limitedMarker = ^uint64(0)

// Backlog is the number of due timers not yet processed (an upper bound on
// the records still to end at the current tick): the leader proposes Expire
// entries while it is positive.
func (e *expiry) Backlog() int { return len(e.backlog) }

func (e *expiry) applyExpire(c *Expire) {
	if c.Tick != e.tick || c.Max == 0 {
		return
	}
	e.expireDue(c.Max, c.WallMS, true)
}

// timerLess orders due timers: by kind, then id. A replica restored from a
// snapshot rebuilds its backlog in this order, so every replica ends the
// same records in the same entry.
func timerLess(a, b timer) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), strings.Compare(a.id, b.id))
}

// expireDue processes the backlog in order until it is empty or max records
// (0: no limit) have ended. A timer that ends nothing (a renewed lease's,
// an ended record's, a duplicate) costs nothing, so the cut falls at the
// same record on a replica whose backlog was rebuilt from a snapshot (it
// holds only the timers that end something).
//
// The backlog is kept sorted (sortTimers, mergeTimers) and taken from the
// front. It was a min-heap: heapify is linear, but each pop compared ids
// along a path of the heap, a third of the state machine's time in a
// storm of 100,000 expiries, and a tick that made them due compared about
// four ids a timer to heapify. The order is the same: by kind, then id.
//
// midTick is set for an Expire: it applies between two ticks, so the
// lock-delays of what it ends count from the next tick boundary, as a
// revoke's do (DESIGN.md).
func (e *expiry) expireDue(max uint64, wallMS int64, midTick bool) {
	used := uint64(0)
	var prev timer
	warm := 0
	for len(e.backlog) > 0 && (max == 0 || used < max) {
		if warm == 0 {
			warm = e.warm(e.backlog[:min(len(e.backlog), warmAhead)])
		}
		warm--
		t := e.backlog[0]
		e.backlog[0] = timer{}
		e.backlog = e.backlog[1:]
		if t == prev {
			continue
		}
		prev = t
		left := uint64(0)
		if max > 0 {
			left = max - used
		}
		used += e.fire(t, left, wallMS, midTick)
	}
	if len(e.backlog) == 0 {
		e.backlog = nil
	}
}

// warmAhead is how many due timers warm reads ahead.
const warmAhead = 32

// warm looks up the records of the lease timers ts (the next to fire) and
// their keys, and returns len(ts). It changes nothing: firing them looks
// the same records up again, which then finds them in the processor's
// cache. A storm's records lie all over the tables, and a lookup that
// waits for memory waits for each step in turn; these lookups do not
// depend on one another, so the processor overlaps their waits.
func (e *expiry) warm(ts []timer) int {
	for i := range ts {
		if ts[i].kind != kindLease {
			continue
		}
		if l := e.lb.leases.Get(ts[i].id); l != nil && e.lb.keys.Get(l.Key) != nil {
			e.warmHits++
		}
	}
	return len(ts)
}

// fire runs one due timer with at most left records to end (0: no limit)
// and returns how many it ended.
func (e *expiry) fire(t timer, left uint64, wallMS int64, midTick bool) uint64 {
	switch t.kind {
	case kindLease:
		l := e.lb.Lease(t.id)
		if l == nil || l.State != StateActive {
			return 0
		}
		if l.SessionID != "" {
			// Left over by a session that ended with more leases than
			// its chunk could end (endSession).
			s := e.sess.Session(l.SessionID)
			if s != nil && s.State == SessionActive {
				return 0
			}
			o := endOpts{state: StateExpired, reason: ReasonSessionEnded, wallMS: wallMS, session: true, delay: true, midTick: midTick}
			if s != nil && s.State == SessionEnded {
				o.state, o.delay = StateReleased, false
			}
			e.lb.end(l, o)
			return 1
		}
		if at := leaseDeadline(l); at > e.tick {
			e.schedule(at, kindLease, l.ID) // renewed since the timer was set
			return 0
		}
		o := endOpts{state: StateExpired, reason: ReasonExpired, wallMS: wallMS, delay: true, midTick: midTick}
		if g := l.GroupID(); g != "" {
			// A lease group expires whole, in one chunk even if that
			// takes the chunk past its bound (by less than MaxGroupKeys).
			_, n := e.grp.endGroup(g, l.ID, o)
			return n
		}
		e.lb.end(l, o)
		return 1
	case kindSession:
		s := e.sess.Session(t.id)
		if s == nil || s.State != SessionActive {
			return 0
		}
		if at := s.ExpiresTick + GraceTicks; at > e.tick {
			e.schedule(at, kindSession, s.ID) // heartbeaten since the timer was set
			return 0
		}
		return e.expireSession(s, left, wallMS, midTick)
	case kindWait:
		key, id, _ := strings.Cut(t.id, "\x00")
		if e.lb.waitTimeout(key, id) {
			return 1
		}
	case kindDelay:
		if e.lb.delayEnd(t.id, wallMS) {
			return 1
		}
	}
	return 0
}

// expireSession ends a due session and as many of its leases as left
// allows (the session counts as one); the rest go to the front of the
// backlog as lease timers, in id order, which is where a restored replica's
// rebuilt backlog has them (snapshot_rebuild.go).
func (e *expiry) expireSession(s *Session, left uint64, wallMS int64, midTick bool) uint64 {
	_, n := e.sess.endSessionN(s, SessionExpired, ReasonExpired, wallMS, left, midTick)
	return n
}

// ended queues the record id of kind, which ended at this tick, for
// pruning.
func (e *expiry) ended(kind uint8, id string) {
	e.prune = append(e.prune, pruneItem{tick: e.tick, kind: kind, id: id})
}

// deferLeases adds the lease timers of ids (active leases of a session that
// ended) to the backlog. They come next, in id order: lease timers sort
// before every session timer.
func (e *expiry) deferLeases(ids []string) {
	ts := make([]timer, len(ids))
	for i, id := range ids {
		ts[i] = timer{kind: kindLease, id: id}
	}
	sortTimers(ts)
	e.backlog = mergeTimers(e.backlog, ts)
}

// leaseDue reports whether active lease l is past its end at the current
// tick but not ended yet (its expiry is in the backlog): it must not be
// renewed, released or heartbeaten, as if it had ended.
func (e *expiry) leaseDue(l *Lease) bool {
	if l.SessionID == "" {
		return leaseDeadline(l) <= e.tick
	}
	s := e.sess.Session(l.SessionID)
	return s == nil || s.State != SessionActive || s.ExpiresTick+GraceTicks <= e.tick
}

// Due reports whether l is active yet past its end at the current tick,
// waiting in the expiry backlog for its chunk: it holds its key still, but
// is not valid for fencing (a validation answers it as expired).
func (e *expiry) Due(l *Lease) bool { return !l.Terminal() && e.leaseDue(l) }

// sortTimers puts ts in processing order (timerLess): by kind, then by
// id, each kind's ids ordered by a radix sort of their 8-byte keys
// (nameOrder), which reads each id once, where comparisons read two ids
// each and a sort of n makes n·log n of them. Equal timers (a record with
// two due) end up side by side.
func sortTimers(ts []timer) {
	if len(ts) < 64 {
		slices.SortFunc(ts, timerLess)
		return
	}
	var count [256]int
	for _, t := range ts {
		count[t.kind]++
	}
	var start [257]int
	for k := range count {
		start[k+1] = start[k] + count[k]
	}
	byKind := make([]timer, len(ts))
	next := start
	for _, t := range ts {
		byKind[next[t.kind]] = t
		next[t.kind]++
	}
	var sc radixScratch
	for k := range count {
		a, b := start[k], start[k+1]
		if a == b {
			continue
		}
		group := byKind[a:b]
		for i, j := range nameOrder(group, func(t *timer) string { return t.id }, &sc) {
			ts[a+i] = group[j]
		}
	}
}

// mergeTimers returns the sorted a and b merged, in processing order. It
// reuses neither's array unless the other is empty.
func mergeTimers(a, b []timer) []timer {
	if len(a) == 0 {
		return b
	}
	if len(b) == 0 {
		return a
	}
	out := make([]timer, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if timerLess(b[0], a[0]) < 0 {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}
