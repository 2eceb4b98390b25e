package recipe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

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
	pending bool // a lock is under way
}

// lock acquires the lease, waiting for a slot (as long as ctx allows) if
// wait is set.
func (l *locker) lock(ctx context.Context, wait bool, meta map[string]string) error {
	l.mu.Lock()
	if l.lease != nil || l.pending {
		l.mu.Unlock()
		return ErrHeld
	}
	l.pending = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pending = false
		l.mu.Unlock()
	}()
	var req wire.AcquireRequest
	// A server configured with a lower cap than MaxWait refuses the wait
	// (INVALID_ARGUMENT, field wait_ms): halve it until accepted.
	waitCap := MaxWait
	fresh := func() error {
		req = wire.AcquireRequest{Key: l.key, Limit: l.limit, Metadata: meta, IdempotencyKey: "recipe-" + randomHex(12)}
		if wait {
			w := waitCap
			if dl, ok := ctx.Deadline(); ok {
				w = min(w, time.Until(dl))
			}
			if w < time.Millisecond {
				return context.DeadlineExceeded
			}
			req.WaitMS = w.Milliseconds()
		}
		return nil
	}
	if err := fresh(); err != nil {
		return err
	}
	// A wait on the server ends with the session: a lease granted then
	// would already be lost.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.s.Context(), cancel)()
	backoff := 50 * time.Millisecond
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
			l.mu.Lock()
			l.lease = lease
			l.mu.Unlock()
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
		var delay time.Duration
		switch wire.ErrorCode(err) {
		case wire.CodeLeaseHeld:
			if !wait {
				return fmt.Errorf("%w: %w", ErrLocked, err)
			}
			// The server's wait ran out: ask again.
		case wire.CodeLockDelay:
			if !wait {
				return fmt.Errorf("%w: %w", ErrLocked, err)
			}
			var e *wire.Error
			delay = 100 * time.Millisecond
			if errors.As(err, &e) && e.RemainingMS > 0 {
				delay = time.Duration(e.RemainingMS) * time.Millisecond
			}
		case wire.CodeInvalidArgument:
			var e *wire.Error
			if !errors.As(err, &e) || e.Field != "wait_ms" || req.WaitMS <= 1000 {
				return err
			}
			waitCap = time.Duration(req.WaitMS/2) * time.Millisecond
		case wire.CodeNoLeader, wire.CodeUnavailable, wire.CodeIndeterminate, "":
			// Retry the same request: its idempotency key makes a
			// duplicate harmless (an INDETERMINATE acquire that was
			// granted is answered again, with its token). Without wait
			// (TryLock), a few times only.
			if tries++; !wait && tries > 3 {
				l.abandon(req)
				return err
			}
			if err := sleepCtx(ctx, backoff); err != nil {
				l.abandon(req)
				return err
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		default:
			return err
		}
		if err := sleepCtx(ctx, delay); err != nil {
			return err
		}
		if err := fresh(); err != nil {
			return err
		}
	}
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
	err := l.s.release(ctx, l.lease)
	switch wire.ErrorCode(err) {
	case wire.CodeNoLeader, wire.CodeUnavailable, wire.CodeIndeterminate, "":
		if err != nil {
			return err // still held: Unlock may be called again
		}
	}
	l.lease = nil
	return err
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

// Done is the session's Done: closed before the server could end the lock.
func (m *Mutex) Done() <-chan struct{} { return m.l.s.Done() }

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

// Done is the session's Done: closed before the server could end the slot.
func (m *Semaphore) Done() <-chan struct{} { return m.l.s.Done() }

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
