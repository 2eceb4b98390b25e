package fsm

import (
	"slices"
	"strings"
)

// Read accessors. They return copy-on-write records that stay valid after
// the caller releases its lock; the caller must hold at least a read lock
// that excludes Apply while calling them.

// Index is the last applied log index.
func (c *core) Index() uint64 { return c.index }

// Tick is the current tick.
func (c *core) Tick() uint64 { return c.tick }

// PeriodMS is the cluster's tick period (0 before the first tick).
func (c *core) PeriodMS() int64 { return c.periodMS }

// WallMS is the leader's wall clock carried by the last tick (display only).
func (c *core) WallMS() int64 { return c.wallMS }

// Fence is the highest fencing token ever assigned.
func (c *core) Fence() uint64 { return c.fence }

// Lease returns a lease record (any retained state) or nil.
func (lb *leaseBook) Lease(id string) *Lease { return lb.leases.Get(id) }

// IdemLease returns the id of the lease (granted or queued) that an
// idempotent acquire with idempotency hash h created, if it is retained.
func (f *FSM) IdemLease(h Hash) (string, bool) {
	id, ok := f.idem[h]
	return id, ok
}

// Session returns a session record (any retained state) or nil.
func (sb *sessionBook) Session(id string) *Session { return sb.sessions[id] }

// Counts returns the number of active leases and active sessions.
func (f *FSM) Counts() (leases, sessions int) { return f.active, f.sessOpen }

// ReadState is the state a read shows of l: its own, except that a lease
// past its end whose expiry waits in the backlog (Due) reads as expired, as
// a validation answers it. Only its key's occupancy tells it from an ended
// lease until its chunk applies.
func (f *FSM) ReadState(l *Lease) State {
	if f.Due(l) {
		return StateExpired
	}
	return l.State
}

// EndTick is the nominal end tick of an active lease: its own for a
// standalone lease, its session's for a bound one.
func (f *FSM) EndTick(l *Lease) uint64 { return f.leaseEnd(l) }

// ActiveOnKey returns the active leases on key in grant order.
func (f *FSM) ActiveOnKey(key string) []*Lease {
	ks := f.keys.Get(key)
	if ks == nil {
		return nil
	}
	out := make([]*Lease, 0, len(ks.active()))
	for _, id := range ks.active() {
		out = append(out, f.leases.Get(id))
	}
	return out
}

// KeyFull reports whether an acquire on key would find no free slot now
// (every slot held or in lock-delay, or others queued first): an acquire
// that may wait would then queue rather than be granted. A hint for the
// batcher only; the entry's own apply decides.
func (f *FSM) KeyFull(key string) bool {
	ks := f.keys.Get(key)
	return ks != nil && (ks.free() <= 0 || ks.nWaiters() > 0)
}

// KeyWaiters is the number of acquires queued on key now (a hint for
// the batcher only, as KeyFull is).
func (f *FSM) KeyWaiters(key string) int {
	ks := f.keys.Get(key)
	if ks == nil {
		return 0
	}
	return ks.nWaiters()
}

// KeyLockDelay returns the end tick of the earliest lock-delay on key, or 0.
func (f *FSM) KeyLockDelay(key string) uint64 {
	ks := f.keys.Get(key)
	if ks == nil || len(ks.blocked()) == 0 {
		return 0
	}
	until := ks.blocked()[0].Until
	for _, b := range ks.blocked() {
		until = min(until, b.Until)
	}
	return until
}

// LeaseFilter selects leases in Leases. Empty fields match everything.
type LeaseFilter struct {
	Key, Prefix, Holder, SessionID string
	State                          State
	After                          string // ids strictly greater than this
	Limit                          int    // at most this many (0: no limit)
	// Scan bounds the records a listing that walks the id index looks at
	// (0: no bound). When it runs out, the listing returns what matched so
	// far, possibly nothing, with the last id it looked at as the cursor.
	Scan int
}

// Leases returns the matching leases ordered by id, and the id to continue
// after when the limit cut the list (empty when it did not). A state filter
// matches ReadState (a due lease is expired, not active). Filters by
// active leases of a key or holder use their indexes; other listings walk
// the id index from the cursor.
func (f *FSM) Leases(q LeaseFilter) ([]*Lease, string) {
	match := func(l *Lease) bool {
		return l != nil && (q.After == "" || l.ID > q.After) &&
			(q.Key == "" || l.Key == q.Key) && (q.Prefix == "" || strings.HasPrefix(l.Key, q.Prefix)) &&
			(q.Holder == "" || l.Holder == q.Holder) && (q.SessionID == "" || l.SessionID == q.SessionID) &&
			(q.State == 0 || f.ReadState(l) == q.State)
	}
	if !f.anyKey(q.Key, q.Prefix) {
		return nil, "" // no record has such a key: nothing to walk
	}
	var out []*Lease
	switch {
	case q.State == StateActive && q.Key != "":
		for _, l := range f.ActiveOnKey(q.Key) {
			if match(l) {
				out = append(out, l)
			}
		}
		slices.SortFunc(out, func(a, b *Lease) int { return strings.Compare(a.ID, b.ID) })
	case q.State == StateActive && q.Holder != "":
		if hi := f.holders[q.Holder]; hi != nil {
			hi.leases.ascend(q.After, func(id string) bool {
				if l := f.leases.Get(id); match(l) {
					out = append(out, l)
				}
				return q.Limit == 0 || len(out) <= q.Limit
			})
		}
	default:
		var b budget
		f.order.ascend(q.After, func(id string) bool {
			if !b.take(q.Scan, id) {
				return false
			}
			if l := f.leases.Get(id); match(l) {
				out = append(out, l)
			}
			return q.Limit == 0 || len(out) <= q.Limit
		})
		if b.out && (q.Limit == 0 || len(out) <= q.Limit) {
			return out, b.last
		}
	}
	if q.Limit > 0 && len(out) > q.Limit {
		return out[:q.Limit], out[q.Limit-1].ID
	}
	return out, ""
}

// budget counts the ids a bounded listing looks at.
type budget struct {
	n    int
	last string // the last id looked at
	out  bool   // an id was left unexamined for want of budget
}

// take reports whether one more id (id) may be looked at under max (0: no
// bound).
func (b *budget) take(max int, id string) bool {
	if max > 0 && b.n == max {
		b.out = true
		return false
	}
	b.n++
	b.last = id
	return true
}

// Sessions returns sessions of holder (all when empty) ordered by id, after
// the cursor, at most limit (0: all), and the next cursor.
func (f *FSM) Sessions(holder, after string, limit int) ([]*Session, string) {
	return f.SessionsScan(holder, after, limit, 0)
}

// SessionsScan is Sessions looking at no more than scan sessions (0: no
// bound); when that runs out, it returns what matched so far with the last
// id it looked at as the cursor.
func (f *FSM) SessionsScan(holder, after string, limit, scan int) ([]*Session, string) {
	var out []*Session
	var b budget
	f.sessIDs.ascend(after, func(id string) bool {
		if !b.take(scan, id) {
			return false
		}
		if s := f.sessions[id]; s != nil && (holder == "" || s.Holder == holder) {
			out = append(out, s)
		}
		return limit == 0 || len(out) <= limit
	})
	if b.out && (limit == 0 || len(out) <= limit) {
		return out, b.last
	}
	if limit > 0 && len(out) > limit {
		return out[:limit], out[limit-1].ID
	}
	return out, ""
}

// Waiting is the number of queued acquires.
func (f *FSM) Waiting() int { return len(f.waiting) }
