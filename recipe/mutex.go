package recipe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/ctxtime"
	"github.com/leasehold/leasehold/wire"
)

// ErrLocked is returned by TryLock and TryAcquire when no slot is free
// (LEASE_HELD, or LOCK_DELAY after an involuntary end); the server's error
// is wrapped with it.
var ErrLocked = errors.New("recipe: held by another holder")

// ErrNotHeld is returned by Unlock, Release and Resign without a lease.
var ErrNotHeld = errors.New("recipe: not held")

// ErrHeld is returned by Lock, Acquire and Campaign when this value already
// holds its lease.
var ErrHeld = errors.New("recipe: already held")

// MaxWait is the longest wait_ms one request asks for: the server's default
// cap. Waiting longer is asking again, as often as the context allows.
const MaxWait = 5 * time.Minute

// locker takes one lease with a given limit on a key, bound to a session:
// the part Mutex, Semaphore and Election share.
type locker struct {
	s     *Session
	key   string
	limit uint32

	mu      sync.Mutex
	lease   *wire.Lease
	cur     *hold // the lease's loss signal; after an unlock, the last one
	pending bool  // a lock is under way
}

// lock acquires the lease, waiting for a slot (as long as ctx allows) if
// wait is set.
func (l *locker) lock(ctx context.Context, wait bool, meta map[string]string) error {
	if err := l.begin(); err != nil {
		return err
	}
	defer func() {
		l.mu.Lock()
		l.pending = false
		l.mu.Unlock()
	}()
	var req wire.AcquireRequest
	// A server configured with a lower cap than MaxWait refuses the wait
	// (INVALID_ARGUMENT, field wait_ms): halve it until accepted.
	waitCap := MaxWait
	fresh := func() (err error) {
		req, err = l.request(ctx, wait, waitCap, meta)
		return err
	}
	if err := fresh(); err != nil {
		return err
	}
	// A wait on the server ends with the session: a lease granted then
	// would already be lost.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.s.Context(), cancel)()
	backoff := newBackoff()
	tries := 0
	// Every turn either waits on the server (wait_ms), sleeps, or returns;
	// ctx bounds them all.
	for {
		if err := l.s.alive(); err != nil {
			return err
		}
		lease, err := l.s.acquire(actx, req)
		if err == nil && lease.State != "" && lease.State != "active" {
			// A retry answered with the lease its first attempt got, which
			// has ended since (revoked, released): not held. Ask anew.
			if tries++; !wait && tries > 3 {
				return fmt.Errorf("%w: lease %s is %s", ErrLocked, lease.LeaseID, lease.State)
			}
			if err := fresh(); err != nil {
				return err
			}
			continue
		}
		if err == nil {
			if err := l.s.alive(); err != nil {
				return err // the lease, bound to the session, is gone with it
			}
			l.adopt(lease)
			return nil
		}
		if err := l.s.alive(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			// The acquire may have been granted meanwhile (a grant can race
			// the end of the wait): give it back, or this holder would
			// find its own lease in the way until the session ends.
			l.abandon(req)
			return ctx.Err()
		}
		delay, same, stop := afterAcquireFailure(err, wait, req.WaitMS, &waitCap)
		if stop != nil {
			return stop
		}
		if same {
			if err := l.retrySame(ctx, req, wait, &tries, backoff, err); err != nil {
				return err
			}
			continue
		}
		if err := sleepCtx(ctx, delay); err != nil {
			return err
		}
		if err := fresh(); err != nil {
			return err
		}
	}
}

// retrySame backs off before lock retries req after the transient error
// err: its idempotency key makes a duplicate harmless (an INDETERMINATE
// acquire that was granted is answered again, with its token). Without wait
// (TryLock), a few times only. It returns the error to give up with, req
// abandoned.
func (l *locker) retrySame(ctx context.Context, req wire.AcquireRequest, wait bool, tries *int, backoff *client.Backoff, err error) error {
	if *tries++; !wait && *tries > 3 {
		l.abandon(req)
		return err
	}
	if err := sleepCtx(ctx, backoff.Next()); err != nil {
		l.abandon(req)
		return err
	}
	return nil
}

// begin marks a lock under way, forgetting a lease that was lost; it
// returns ErrHeld if a lease is held or another lock is under way.
func (l *locker) begin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease != nil && l.cur.reason() != nil {
		// Lost: forget it and lock anew.
		l.s.untrack(l.cur)
		l.lease = nil
	}
	if l.lease != nil || l.pending {
		return ErrHeld
	}
	l.pending = true
	return nil
}

// request is a new acquire request (a new idempotency key) for the lease,
// waiting up to waitCap, and no longer than ctx allows, if wait is set.
func (l *locker) request(ctx context.Context, wait bool, waitCap time.Duration, meta map[string]string) (wire.AcquireRequest, error) {
	req := wire.AcquireRequest{Key: l.key, Limit: l.limit, Metadata: meta, IdempotencyKey: "recipe-" + randomHex(12)}
	if wait {
		w := waitCap
		if dl, ok := ctx.Deadline(); ok {
			w = min(w, time.Until(dl))
		}
		if w < time.Millisecond {
			return req, context.DeadlineExceeded
		}
		req.WaitMS = w.Milliseconds()
	}
	return req, nil
}

// adopt makes lease the held one and watches it for a loss.
func (l *locker) adopt(lease *wire.Lease) {
	h := newHold(lease)
	l.mu.Lock()
	l.lease, l.cur = lease, h
	l.mu.Unlock()
	l.s.track(h)
}

// afterAcquireFailure decides what lock does after an acquire (asking for
// waitMS) failed with err: stop with an error, retry the same request after
// a backoff (same), or ask anew after delay. A server that refused the wait
// lowers *waitCap.
func afterAcquireFailure(err error, wait bool, waitMS int64, waitCap *time.Duration) (delay time.Duration, same bool, stop error) {
	switch wire.ErrorCode(err) {
	case wire.CodeLeaseHeld:
		if !wait {
			return 0, false, fmt.Errorf("%w: %w", ErrLocked, err)
		}
		// The server's wait ran out: ask again.
	case wire.CodeLockDelay:
		if !wait {
			return 0, false, fmt.Errorf("%w: %w", ErrLocked, err)
		}
		var e *wire.Error
		delay = 100 * time.Millisecond
		if errors.As(err, &e) && e.RemainingMS > 0 {
			delay = time.Duration(e.RemainingMS) * time.Millisecond
		}
	case wire.CodeInvalidArgument:
		var e *wire.Error
		if !errors.As(err, &e) || e.Field != "wait_ms" || waitMS <= 1000 {
			return 0, false, err
		}
		*waitCap = time.Duration(waitMS/2) * time.Millisecond
	case wire.CodeNoLeader, wire.CodeUnavailable, wire.CodeIndeterminate, "":
		return 0, true, nil
	default:
		return 0, false, err
	}
	return delay, false, nil
}

// abandon gives back what an acquire that is being given up may have been
// granted: the same request (same idempotency key) asked again without
// waiting answers with the lease if it was granted, and that lease is
// released. Best effort, bounded: the session's end frees it anyway.
func (l *locker) abandon(req wire.AcquireRequest) {
	if l.s.alive() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.s.Context()), abandonTimeout)
	defer cancel()
	req.WaitMS = 0
	if lease, err := l.s.acquire(ctx, req); err == nil && (lease.State == "" || lease.State == "active") {
		_ = l.s.release(ctx, lease)
	}
}

// abandonTimeout bounds abandon.
const abandonTimeout = 5 * time.Second

// unlock releases the lease. A lease that is already gone (revoked,
// expired with its session) is forgotten and its error returned.
func (l *locker) unlock(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == nil {
		return ErrNotHeld
	}
	h := l.cur
	// From here on a release seen on the server is this one (an earlier
	// attempt's, answered INDETERMINATE, perhaps).
	retried := h.setReleasing()
	err := l.s.release(ctx, l.lease)
	switch wire.ErrorCode(err) {
	case wire.CodeNoLeader, wire.CodeUnavailable, wire.CodeIndeterminate, "":
		if err != nil {
			return err // still held: Unlock may be called again
		}
	}
	l.s.untrack(h)
	if err == nil || retried && wire.ErrorCode(err) == wire.CodeLeaseReleased {
		h.lose(ErrUnlocked)
	} else {
		h.lose(fmt.Errorf("%w: %w", ErrLost, err))
	}
	l.lease = nil
	return err
}

// closed is the loss signal of a locker that never held its lease.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// lost returns the loss signal of the lease held, or of the last one.
func (l *locker) lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur == nil {
		return closed
	}
	return l.cur.lost
}

// lostErr returns nil while the lease is held and not lost, then why it
// was lost; ErrNotHeld before the first lock.
func (l *locker) lostErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur == nil {
		return ErrNotHeld
	}
	return l.cur.reason()
}

// setMeta sets the metadata entry key of the held lease to value, keeping
// the lease (a renewal that carries the lease's new metadata).
func (l *locker) setMeta(ctx context.Context, key, value string) error {
	l.mu.Lock()
	lease, h := l.lease, l.cur
	l.mu.Unlock()
	if lease == nil {
		return ErrNotHeld
	}
	if err := h.reason(); err != nil {
		return err
	}
	meta := maps.Clone(lease.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[key] = value
	nl, err := l.s.b.RenewWith(ctx, wire.RenewRequest{LeaseID: lease.LeaseID, Token: lease.Token, Metadata: meta})
	if err != nil {
		if lost := h.reason(); lost != nil {
			return lost
		}
		return err
	}
	l.mu.Lock()
	if l.lease == lease {
		c := *lease
		c.Metadata = nl.Metadata
		l.lease = &c
	}
	l.mu.Unlock()
	return nil
}

// held returns the lease, nil when not held.
func (l *locker) held() *wire.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == nil {
		return nil
	}
	c := *l.lease
	c.Token = ""
	return &c
}

func (l *locker) token() uint64 {
	if h := l.held(); h != nil {
		return h.FencingToken
	}
	return 0
}

// Mutex is a distributed lock on one key, bound to a session. It is safe
// for concurrent use, but one Mutex is one holder: make one per goroutine
// that contends.
type Mutex struct{ l locker }

// NewMutex returns a mutex on key for the session.
func NewMutex(s *Session, key string) *Mutex {
	return &Mutex{locker{s: s, key: key, limit: 1}}
}

// Lock takes the lock, waiting as long as ctx allows (in turns of at most
// MaxWait, the server's cap on one wait, first come first served on the
// server). It fails with ErrSessionLost once the session is lost, and with
// ctx's error when ctx ends first.
func (m *Mutex) Lock(ctx context.Context) error { return m.l.lock(ctx, true, nil) }

// TryLock takes the lock if it is free, or fails with ErrLocked.
func (m *Mutex) TryLock(ctx context.Context) error { return m.l.lock(ctx, false, nil) }

// Unlock releases the lock. It returns the server's error (LEASE_REVOKED,
// say) if the lease had already ended.
func (m *Mutex) Unlock(ctx context.Context) error { return m.l.unlock(ctx) }

// Token returns the fencing token of the lock held, 0 when not held.
func (m *Mutex) Token() uint64 { return m.l.token() }

// Lease returns the lease held (without its token), nil when not held.
func (m *Mutex) Lease() *wire.Lease { return m.l.held() }

// Key returns the mutex's key.
func (m *Mutex) Key() string { return m.l.key }

// Done is the session's Done: closed before the server could end the lock
// by ending the session. It does not close when the lock's own lease ends
// (an operator's revoke): watch Lost for that.
func (m *Mutex) Done() <-chan struct{} { return m.l.s.Done() }

// Lost returns a channel closed when the lock taken by the last Lock or
// TryLock is no longer held: its lease revoked by an operator or ended on
// the server, the session lost (Lost closes right after Done), or Unlock.
// An end on the server is learnt from the event stream of the session's
// holder, moments after it happened; the session's loss before the server
// could end it. Call it after Lock: each Lock has its own channel. Before
// the first Lock it returns a closed channel.
func (m *Mutex) Lost() <-chan struct{} { return m.l.lost() }

// LostErr returns nil while the lock is held, then why Lost closed: an
// error wrapping ErrLost (and the server's LEASE_REVOKED, LEASE_RELEASED or
// LEASE_EXPIRED, or ErrSessionLost), or ErrUnlocked; ErrNotHeld before the
// first Lock. A Lock after a loss takes the lock anew.
func (m *Mutex) LostErr() error { return m.l.lostErr() }

// Semaphore admits up to Limit holders of one key at once: the server's
// per-key limit (every holder of the key must use the same limit, else
// LIMIT_MISMATCH). One Semaphore value takes one slot.
type Semaphore struct{ l locker }

// NewSemaphore returns a semaphore with limit slots on key for the session.
func NewSemaphore(s *Session, key string, limit uint32) *Semaphore {
	return &Semaphore{locker{s: s, key: key, limit: limit}}
}

// Acquire takes a slot, waiting as long as ctx allows (see Mutex.Lock).
func (m *Semaphore) Acquire(ctx context.Context) error { return m.l.lock(ctx, true, nil) }

// TryAcquire takes a slot if one is free, or fails with ErrLocked.
func (m *Semaphore) TryAcquire(ctx context.Context) error { return m.l.lock(ctx, false, nil) }

// Release gives the slot back.
func (m *Semaphore) Release(ctx context.Context) error { return m.l.unlock(ctx) }

// Token returns the fencing token of the slot held, 0 when none.
func (m *Semaphore) Token() uint64 { return m.l.token() }

// Lease returns the lease of the slot held (without its token), nil when
// none.
func (m *Semaphore) Lease() *wire.Lease { return m.l.held() }

// Done is the session's Done: closed before the server could end the slot
// by ending the session; see Lost for the slot's own end.
func (m *Semaphore) Done() <-chan struct{} { return m.l.s.Done() }

// Lost returns a channel closed when the slot taken by the last Acquire or
// TryAcquire is no longer held (see Mutex.Lost).
func (m *Semaphore) Lost() <-chan struct{} { return m.l.lost() }

// LostErr returns nil while the slot is held, then why Lost closed (see
// Mutex.LostErr; ErrUnlocked after Release).
func (m *Semaphore) LostErr() error { return m.l.lostErr() }

// Retries after a failure that may pass (no leader, a node unreachable)
// back off with full jitter from retryBase up to retryMax: recipes that
// failed together, at a failover, do not retry in lockstep.
const (
	retryBase = 50 * time.Millisecond
	retryMax  = 2 * time.Second
)

// backoffRand is the random source of the backoffs' jitter (see
// client.Backoff.Rand); nil outside tests.
var backoffRand func(n int64) int64

func newBackoff() *client.Backoff {
	return &client.Backoff{Base: retryBase, Max: retryMax, Rand: backoffRand}
}

// sleepCtx sleeps for d, or until ctx ends (its error).
var sleepCtx = ctxtime.Sleep

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
