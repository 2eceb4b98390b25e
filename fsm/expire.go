package fsm

import (
	"cmp"
	"container/heap"
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

func (c *Expire) encode(e *enc) {
	e.uvarint(c.Tick)
	e.varint(c.WallMS)
	e.uvarint(c.Max)
}

func (c *Expire) decode(d *dec) {
	c.Tick = d.uvarint()
	c.WallMS = d.varint()
	c.Max = d.uvarint()
	if d.err == nil && c.Max == 0 {
		d.fail("expire: max must be positive")
	}
}

// limitedMarker is the ExpireMax newBody gives a TypeTickLimited command,
// so that Tick.decode knows to read the field.
const limitedMarker = ^uint64(0)

// Backlog is the number of due timers not yet processed (an upper bound on
// the records still to end at the current tick): the leader proposes Expire
// entries while it is positive.
func (f *FSM) Backlog() int { return len(f.backlog) }

func (f *FSM) applyExpire(c *Expire) {
	if c.Tick != f.tick || c.Max == 0 {
		return
	}
	f.expireDue(c.Max, c.WallMS, true)
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
// Without a limit the backlog is sorted and processed whole. With one it is
// a min-heap, so that a tick which makes 100,000 timers due orders only
// what each chunk takes (heapify is linear; a pop is logarithmic) instead
// of sorting them all in its own entry: the order is the same.
//
// midTick is set for an Expire: it applies between two ticks, so the
// lock-delays of what it ends count from the next tick boundary, as a
// revoke's do (DESIGN.md).
func (f *FSM) expireDue(max uint64, wallMS int64, midTick bool) {
	used := uint64(0)
	var prev timer
	if max == 0 {
		f.sortBacklog()
	}
	for len(f.backlog) > 0 && (max == 0 || used < max) {
		var t timer
		if max == 0 {
			t = f.backlog[0]
			f.backlog[0] = timer{}
			f.backlog = f.backlog[1:]
		} else {
			t = (*timerHeap)(&f.backlog).pop()
		}
		if t == prev {
			continue
		}
		prev = t
		left := uint64(0)
		if max > 0 {
			left = max - used
		}
		used += f.fire(t, left, wallMS, midTick)
	}
	if len(f.backlog) == 0 {
		f.backlog = nil
	}
}

// fire runs one due timer with at most left records to end (0: no limit)
// and returns how many it ended.
func (f *FSM) fire(t timer, left uint64, wallMS int64, midTick bool) uint64 {
	switch t.kind {
	case kindLease:
		l := f.leases.Get(t.id)
		if l == nil || l.State != StateActive {
			return 0
		}
		if l.SessionID != "" {
			// Left over by a session that ended with more leases than
			// its chunk could end (endSession).
			s := f.sessions[l.SessionID]
			if s != nil && s.State == SessionActive {
				return 0
			}
			o := endOpts{state: StateExpired, reason: ReasonSessionEnded, wallMS: wallMS, session: true, delay: true, midTick: midTick}
			if s != nil && s.State == SessionEnded {
				o.state, o.delay = StateReleased, false
			}
			f.end(l, o)
			return 1
		}
		if at := leaseDeadline(l); at > f.tick {
			f.schedule(at, kindLease, l.ID) // renewed since the timer was set
			return 0
		}
		o := endOpts{state: StateExpired, reason: ReasonExpired, wallMS: wallMS, delay: true, midTick: midTick}
		if g := l.GroupID(); g != "" {
			// A lease group expires whole, in one chunk even if that
			// takes the chunk past its bound (by less than MaxGroupKeys).
			_, n := f.endGroup(g, l.ID, o)
			return n
		}
		f.end(l, o)
		return 1
	case kindSession:
		s := f.sessions[t.id]
		if s == nil || s.State != SessionActive {
			return 0
		}
		if at := s.ExpiresTick + GraceTicks; at > f.tick {
			f.schedule(at, kindSession, s.ID) // heartbeaten since the timer was set
			return 0
		}
		return f.expireSession(s, left, wallMS, midTick)
	case kindWait:
		key, id, _ := strings.Cut(t.id, "\x00")
		if f.waitTimeout(key, id) {
			return 1
		}
	case kindDelay:
		if f.delayEnd(t.id, wallMS) {
			return 1
		}
	}
	return 0
}

// expireSession ends a due session and as many of its leases as left
// allows (the session counts as one); the rest go to the front of the
// backlog as lease timers, in id order, which is where a restored replica's
// rebuilt backlog has them (snapshot_rebuild.go).
func (f *FSM) expireSession(s *Session, left uint64, wallMS int64, midTick bool) uint64 {
	_, n := f.endSessionN(s, SessionExpired, ReasonExpired, wallMS, left, midTick)
	return n
}

// deferLeases adds the lease timers of ids (active leases of a session that
// ended) to the backlog (a heap: only a limited tick or Expire defers). They
// come next, in id order: lease timers sort before every session timer.
func (f *FSM) deferLeases(ids []string) {
	for _, id := range ids {
		f.backlog = append(f.backlog, timer{kind: kindLease, id: id})
	}
	heap.Init((*timerHeap)(&f.backlog))
}

// leaseDue reports whether active lease l is past its end at the current
// tick but not ended yet (its expiry is in the backlog): it must not be
// renewed, released or heartbeaten, as if it had ended.
func (f *FSM) leaseDue(l *Lease) bool {
	if l.SessionID == "" {
		return leaseDeadline(l) <= f.tick
	}
	s := f.sessions[l.SessionID]
	return s == nil || s.State != SessionActive || s.ExpiresTick+GraceTicks <= f.tick
}

// Due reports whether l is active yet past its end at the current tick,
// waiting in the expiry backlog for its chunk: it holds its key still, but
// is not valid for fencing (a validation answers it as expired).
func (f *FSM) Due(l *Lease) bool { return !l.Terminal() && f.leaseDue(l) }

// sortBacklog puts the backlog in processing order.
func (f *FSM) sortBacklog() {
	slices.SortFunc(f.backlog, timerLess)
}

// timerHeap is the backlog as a min-heap in processing order.
type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return timerLess(h[i], h[j]) < 0 }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }

// pop is heap.Pop without boxing the timer in an interface (an
// allocation per expiry in a storm of 100,000).
func (h *timerHeap) pop() timer {
	old := *h
	n := len(old) - 1
	old[0], old[n] = old[n], old[0]
	for i := 0; ; {
		c := 2*i + 1
		if c >= n || c < 0 {
			break
		}
		if r := c + 1; r < n && timerLess(old[r], old[c]) < 0 {
			c = r
		}
		if timerLess(old[c], old[i]) >= 0 {
			break
		}
		old[i], old[c] = old[c], old[i]
		i = c
	}
	t := old[n]
	old[n] = timer{}
	*h = old[:n]
	return t
}

func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = timer{}
	*h = old[:len(old)-1]
	return t
}
