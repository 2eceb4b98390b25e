package recipe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// ErrLost is wrapped by the reason a lock, slot or leadership was lost
// against its holder's will: its lease ended on the server (revoked by an
// operator: LEASE_REVOKED; ended with its session: LEASE_RELEASED or
// LEASE_EXPIRED, reason session_ended) or its session was lost
// (ErrSessionLost). wire.ErrorCode tells the server's code when there is one.
var ErrLost = errors.New("recipe: lock lost")

// ErrUnlocked is the reason of a loss signal closed by the holder's own
// Unlock, Release or Resign.
var ErrUnlocked = errors.New("recipe: released by its holder")

// maxEnded bounds the ids of ended leases a session remembers while no
// lock tracks them (an end can be reported before the acquire's answer).
const maxEnded = 256

// hold is one acquisition of a locker: its lease and its loss signal.
type hold struct {
	lease *wire.Lease
	lost  chan struct{}
	stop  func() bool // stops the session's AfterFunc

	mu        sync.Mutex
	err       error
	releasing bool // the holder has sent a release
}

func newHold(l *wire.Lease) *hold {
	return &hold{lease: l, lost: make(chan struct{}), stop: func() bool { return false }}
}

// lose records why the hold is lost and closes lost, once.
func (h *hold) lose(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return
	}
	h.err = err
	close(h.lost)
}

func (h *hold) reason() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// setReleasing marks the holder's release under way and reports whether
// it already was (an earlier Unlock failed without knowing the outcome).
func (h *hold) setReleasing() (was bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was, h.releasing = h.releasing, true
	return was
}

// ended reports a lease end seen on the server: the holder's own release
// while it is under way is ErrUnlocked, anything else a loss.
func (h *hold) ended(typ, reason string) {
	h.mu.Lock()
	own := h.releasing && typ == "released" && reason != "session_ended"
	h.mu.Unlock()
	if own {
		h.lose(ErrUnlocked)
		return
	}
	h.lose(endedError(h.lease.LeaseID, typ, reason))
}

func endedError(id, state, reason string) error {
	code := wire.CodeLeaseExpired
	switch state {
	case "released":
		code = wire.CodeLeaseReleased
	case "revoked":
		code = wire.CodeLeaseRevoked
	}
	msg := "lease " + id + " " + state
	if reason != "" {
		msg += ": " + reason
	}
	return fmt.Errorf("%w: %w", ErrLost, &wire.Error{Code: code, Message: msg})
}

// losses tracks the holds of a session and learns of their ends from one
// event stream (filtered by the session's holder), opened with the first
// lock taken on the session and kept until the session ends.
type losses struct {
	mu      sync.Mutex
	holds   map[string]*hold // by lease id
	ended   map[string][2]string
	order   []string // ended's ids, oldest first
	started bool
}

// track starts reporting the loss of h: at once if its lease was already
// seen ending, when the session is lost, or when the event stream says its
// lease ended.
func (s *Session) track(h *hold) {
	id := h.lease.LeaseID
	s.loss.mu.Lock()
	if e, ok := s.loss.ended[id]; ok {
		s.loss.mu.Unlock()
		h.ended(e[0], e[1])
		return
	}
	if s.loss.holds == nil {
		s.loss.holds = make(map[string]*hold)
	}
	s.loss.holds[id] = h
	start := !s.loss.started
	s.loss.started = true
	s.loss.mu.Unlock()
	h.stop = context.AfterFunc(s.Context(), func() {
		h.lose(fmt.Errorf("%w: %w", ErrLost, s.alive()))
	})
	if start {
		go s.watchLosses()
	}
}

// untrack stops reporting the loss of h.
func (s *Session) untrack(h *hold) {
	h.stop()
	s.loss.mu.Lock()
	if s.loss.holds[h.lease.LeaseID] == h {
		delete(s.loss.holds, h.lease.LeaseID)
	}
	s.loss.mu.Unlock()
}

// leaseEnded hands the end of lease id to its hold, or remembers it for a
// hold not tracked yet.
func (s *Session) leaseEnded(id, state, reason string) {
	s.loss.mu.Lock()
	h := s.loss.holds[id]
	if h == nil {
		if s.loss.ended == nil {
			s.loss.ended = make(map[string][2]string)
		}
		if _, dup := s.loss.ended[id]; !dup {
			s.loss.ended[id] = [2]string{state, reason}
			s.loss.order = append(s.loss.order, id)
			if len(s.loss.order) > maxEnded {
				delete(s.loss.ended, s.loss.order[0])
				s.loss.order = s.loss.order[1:]
			}
		}
	}
	s.loss.mu.Unlock()
	if h != nil {
		h.ended(state, reason)
	}
}

func (s *Session) tracked() []*hold {
	s.loss.mu.Lock()
	defer s.loss.mu.Unlock()
	out := make([]*hold, 0, len(s.loss.holds))
	for _, h := range s.loss.holds {
		out = append(out, h)
	}
	return out
}

// lossEvent handles one event of the session's holder.
func (s *Session) lossEvent(ev wire.Event) {
	switch ev.Type {
	case "released", "expired", "revoked":
		if ev.Lease == nil || ev.Lease.SessionID != s.ID() {
			return // not a lease of this session: no lock of it
		}
		reason := ev.Reason
		if reason == "" {
			reason = ev.Lease.EndReason
		}
		s.leaseEnded(ev.Lease.LeaseID, ev.Type, reason)
	case "session_ended":
		if ev.Session == nil || ev.Session.SessionID != s.ID() {
			return
		}
		// Each lease's own end follows; the session's end is enough.
		for _, h := range s.tracked() {
			h.lose(fmt.Errorf("%w: %w", ErrLost, &wire.Error{Code: wire.CodeSessionEnded,
				Message: "session " + s.ID() + " ended: " + ev.Reason}))
		}
	}
}

// watchLosses follows the events of the session's holder until the session
// ends. The stream starts from the history the server keeps, so an end
// between a grant and the stream's opening is replayed, not missed; when
// the stream fails for good (the cluster unreachable at first, history
// compacted), the tracked leases are read back and the stream opened again
// after a jittered backoff.
func (s *Session) watchLosses() {
	ctx := s.Context()
	backoff := newBackoff()
	last := ""
	for {
		opts := client.WatchOptions{Holder: s.owner, LastEventID: last, FromStart: last == "",
			OnReconnect: func(error, time.Duration) {}}
		err := s.b.Watch(ctx, opts, func(ev wire.Event) error {
			s.lossEvent(ev)
			if ev.ID != "" {
				last = ev.ID
			}
			backoff.Reset()
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if wire.ErrorCode(err) == wire.CodeEventsCompacted {
			last = ""
		}
		s.readLosses(ctx)
		if sleepCtx(ctx, backoff.Next()) != nil {
			return
		}
	}
}

// readLosses reads the session's leases and reports the tracked ones that
// have ended. A lease missing from the answer (a stale read, not yet
// there) is left alone: only a terminal state, which is final, counts.
func (s *Session) readLosses(ctx context.Context) {
	if len(s.tracked()) == 0 {
		return
	}
	req := wire.ListRequest{SessionID: s.ID()}
	for {
		ls, err := s.b.List(ctx, req)
		if err != nil {
			return
		}
		for _, l := range ls.Leases {
			if l.State != "" && l.State != "active" {
				s.loss.mu.Lock()
				h := s.loss.holds[l.LeaseID]
				s.loss.mu.Unlock()
				if h != nil {
					h.ended(l.State, l.EndReason)
				}
			}
		}
		if ls.Next == "" {
			return
		}
		req.After = ls.Next
	}
}
