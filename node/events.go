package node

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// hubEvent is an event as applied, with what rendering it needs later.
type hubEvent struct {
	fsm.Event
	endTick uint64
	ttlMS   int64
	period  int64
	// shared is the event as subscribers see it, rendered by the first
	// subscriber that delivers it and reused by every other one: a
	// thousand subscribers cost one rendering, not a thousand. It is made
	// (under the hub's lock) by the first subscriber that reads the event.
	shared *sharedEvent
}

type sharedEvent struct {
	once sync.Once
	ev   wire.Event
}

// render returns the subscriber view of e, computed once per event.
func (e *hubEvent) render() wire.Event {
	if e.shared == nil {
		return renderEvent(e)
	}
	e.shared.once.Do(func() { e.shared.ev = renderEvent(e) })
	return e.shared.ev
}

type eventID struct {
	index uint64
	seq   uint32
}

func (a eventID) less(b eventID) bool {
	return a.index < b.index || a.index == b.index && a.seq < b.seq
}

func (a eventID) String() string { return fmt.Sprintf("%d-%d", a.index, a.seq) }

// parseEventID reads "<index>-<seq>"; a bare "<index>" means after every
// event of that index.
func parseEventID(s string) (eventID, bool) {
	is, ss, hasSeq := strings.Cut(s, "-")
	idx, err := strconv.ParseUint(is, 10, 64)
	if err != nil {
		return eventID{}, false
	}
	if !hasSeq {
		return eventID{index: idx, seq: ^uint32(0)}, true
	}
	seq, err := strconv.ParseUint(ss, 10, 32)
	if err != nil {
		return eventID{}, false
	}
	return eventID{index: idx, seq: uint32(seq)}, true
}

// hub keeps the most recent events in a ring and feeds subscribers, each at
// its own position, so a slow subscriber never blocks Apply.
type hub struct {
	mu    sync.Mutex
	ring  []hubEvent
	start uint64  // position of the oldest retained event
	end   uint64  // position the next event gets
	floor eventID // every event up to and including floor is gone
	// resetAt is the start position set by the last reset: a subscriber
	// before it lost its stream to a snapshot, not to its own slowness.
	resetAt uint64
	notify  chan struct{}
	closed  bool

	streams atomic.Int64
}

func newHub(size int) *hub {
	return &hub{ring: make([]hubEvent, size), notify: make(chan struct{})}
}

func (h *hub) publish(evs []hubEvent) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	n := uint64(len(h.ring))
	for _, e := range evs {
		if h.end-h.start == n {
			old := h.ring[h.start%n]
			h.floor = eventID{old.Index, old.Seq}
			h.ring[h.start%n] = hubEvent{}
			h.start++
		}
		h.ring[h.end%n] = e // shared: made by the first subscriber to read it
		h.end++
	}
	close(h.notify)
	h.notify = make(chan struct{})
	h.mu.Unlock()
}

// reset forgets all history: state was replaced by a snapshot at index.
// Live subscriptions end with EVENTS_COMPACTED: the events they would have
// missed (or, after an operator's restore, the rewind itself) are not in
// any stream, so their subscribers must re-read the state. Skipping one
// ring position puts every subscriber's position before the new start.
func (h *hub) reset(index uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	for i := range h.ring {
		h.ring[i] = hubEvent{}
	}
	h.end++
	h.start = h.end
	h.resetAt = h.start
	h.floor = eventID{index: index, seq: ^uint32(0)}
	close(h.notify)
	h.notify = make(chan struct{})
}

func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.notify)
	}
}

// position finds where a subscriber resuming after id starts, or reports
// that history no longer reaches back that far.
func (h *hub) position(after eventID) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if after.less(h.floor) {
		return 0, &wire.Error{Code: wire.CodeEventsCompacted, Message: fmt.Sprintf(
			"event history no longer reaches back to %s; the oldest resumable point is %s", after, h.floor)}
	}
	n := uint64(len(h.ring))
	lo, hi := h.start, h.end
	for lo < hi {
		mid := lo + (hi-lo)/2
		e := h.ring[mid%n]
		if (eventID{e.Index, e.Seq}).less(after) || (eventID{e.Index, e.Seq}) == after {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// Subscription delivers events matching a filter, in log order.
type Subscription struct {
	ch     chan wire.Event
	cancel context.CancelFunc
	err    atomic.Pointer[error]
	done   chan struct{}
}

// Events returns the channel of events. It is closed when the subscription
// ends: Close was called, the node closed, or the subscriber fell so far
// behind that history was overwritten (Err says which). An event's Lease and
// Session are shared with every other subscriber: treat them as read-only.
func (s *Subscription) Events() <-chan wire.Event { return s.ch }

// Err reports why the subscription ended, nil while it runs or after Close.
func (s *Subscription) Err() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Close ends the subscription and waits for its goroutine.
func (s *Subscription) Close() {
	s.cancel()
	<-s.done
}

func (s *Subscription) fail(err error) { s.err.Store(&err) }

// run delivers events from ring position pos. Events not after the resume
// point are skipped: a node still replaying its log at startup may not have
// reached that point when the subscription began. It ends with the gate's
// error when the node goes out of service (Gate): what it would deliver
// from then on comes from a state that is not the cluster's; out is
// closed when it does.
func (s *Subscription) run(ctx context.Context, h *hub, gate func() error, out <-chan struct{}, pos uint64, after eventID, f wire.EventFilter) {
	batch := make([]hubEvent, 0, 256)
	for {
		if err := gate(); err != nil {
			s.fail(err)
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			s.fail(errShuttingDown())
			return
		}
		if pos < h.start {
			restored := pos < h.resetAt
			h.mu.Unlock()
			if restored {
				s.fail(&wire.Error{Code: wire.CodeEventsCompacted, Message: "the state was replaced by a snapshot; read it again and subscribe anew"})
			} else {
				s.fail(&wire.Error{Code: wire.CodeEventsCompacted, Message: "subscriber fell behind the event history; resume from the last event id received"})
			}
			return
		}
		n := uint64(len(h.ring))
		batch = batch[:0]
		for p := pos; p < h.end && len(batch) < cap(batch); p++ {
			e := &h.ring[p%n]
			if e.shared == nil {
				// Made here, not when published: with no subscriber
				// the history costs no more than its events.
				e.shared = &sharedEvent{}
			}
			batch = append(batch, *e)
		}
		notify := h.notify
		h.mu.Unlock()
		pos += uint64(len(batch))
		for i := range batch {
			if id := (eventID{batch[i].Index, batch[i].Seq}); !after.less(id) || !matches(&batch[i], f) {
				continue
			}
			select {
			case s.ch <- batch[i].render():
			case <-ctx.Done():
				return
			}
		}
		if len(batch) == 0 {
			select {
			case <-notify:
			case <-out:
			case <-ctx.Done():
				return
			}
		}
	}
}

func matches(e *hubEvent, f wire.EventFilter) bool {
	if f.Key != "" && e.Key != f.Key {
		return false
	}
	if f.Prefix != "" && !strings.HasPrefix(e.Key, f.Prefix) {
		return false
	}
	if f.Holder != "" {
		switch {
		case e.Lease != nil:
			return e.Lease.Holder == f.Holder
		case e.Session != nil:
			return e.Session.Holder == f.Holder
		default:
			return false
		}
	}
	return true
}
