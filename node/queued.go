package node

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// queuedAcquires waits for queued acquires (of a lease or a lease group,
// wait_ms > 0) and withdraws them when their callers give up.
type queuedAcquires struct {
	cfg     *Config
	rep     *replica
	waits   *waitList
	tk      *ticker // the tick period
	metrics *nodeMetrics
	closing <-chan struct{}
	// propose commits the withdrawal of a queued acquire.
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
}

// queuedWait is what a queued acquire (of one lease, or of a lease group)
// waits for: the waiters' id (the lease's, or the group's), the queued
// lease a withdrawal names, the answer once granted, and what the
// refusals say.
type queuedWait struct {
	waitID, leaseID, key string
	what                 string // "acquire", "lease group"
	refusal              string // the message when nothing became free in time
	granted              func() (fsm.Notice, bool)
}

// awaitGrant waits for a queued acquire to be granted or to time out in the
// state machine (awaitQueued).
func (qa *queuedAcquires) awaitGrant(ctx context.Context, id, key string, wait chan fsm.Notice, d time.Duration) (*fsm.Lease, error) {
	no, err := qa.awaitQueued(ctx, queuedWait{waitID: id, leaseID: id, key: key, what: "acquire",
		refusal: "no slot became free within wait_ms",
		granted: func() (fsm.Notice, bool) {
			l := qa.rep.lookupActive(id)
			return fsm.Notice{Lease: l}, l != nil
		}}, wait, d)
	return no.Lease, err
}

// awaitGroup is awaitGrant for a queued lease group g whose first member
// is lease id on key (awaitQueued).
func (qa *queuedAcquires) awaitGroup(ctx context.Context, g, id, key string, wait chan fsm.Notice, d time.Duration) ([]*fsm.Lease, error) {
	no, err := qa.awaitQueued(ctx, queuedWait{waitID: g, leaseID: id, key: key, what: "lease group",
		refusal: "the lease group's keys did not all become free within wait_ms",
		granted: func() (fsm.Notice, bool) {
			ls := qa.rep.lookupGroup(g)
			return fsm.Notice{Leases: ls}, ls != nil
		}}, wait, d)
	return no.Leases, err
}

// awaitQueued waits for the state machine's answer to a queued acquire. If
// the caller gives up first and no other request (an idempotent replay)
// waits for the same grant, the wait is withdrawn; if the withdrawal cannot
// be confirmed the answer is INDETERMINATE, never a plain refusal, because
// the acquire might still be granted.
func (qa *queuedAcquires) awaitQueued(ctx context.Context, q queuedWait, wait chan fsm.Notice, d time.Duration) (fsm.Notice, error) {
	if wait == nil || !qa.waits.has(q.waitID, wait) {
		// A replay of a queued request: listen for the original's grant.
		wait = qa.waits.add(q.waitID)
	}
	listening := true
	defer func() {
		if listening {
			qa.waits.drop(q.waitID, wait)
		}
	}()
	// The grant may have happened before we started listening.
	if no, ok := q.granted(); ok {
		return no, nil
	}
	local := newClockTimer(d + 3*qa.tk.period() + qa.cfg.ApplyTimeout)
	defer local.Stop()
	select {
	case no := <-wait:
		if no.Err != nil {
			return fsm.Notice{}, no.Err
		}
		return no, nil
	case <-local.C:
	case <-ctx.Done():
	case <-qa.closing:
	}
	listening = false
	if qa.waits.drop(q.waitID, wait) > 0 {
		// Another request with the same idempotency key still waits for
		// this grant; leave it queued for that one.
		return fsm.Notice{}, &wire.Error{Code: wire.CodeIndeterminate,
			Message: "gave up waiting; the " + q.what + " stays queued for a retry with the same idempotency key"}
	}
	err := qa.cancelWait(q.leaseID, q.key)
	if no, ok := q.granted(); ok {
		return no, nil
	}
	if err != nil {
		return fsm.Notice{}, &wire.Error{Code: wire.CodeIndeterminate,
			Message: "gave up waiting but could not withdraw the queued " + q.what + "; it may still be granted"}
	}
	if ctx.Err() != nil {
		return fsm.Notice{}, ctx.Err()
	}
	return fsm.Notice{}, &wire.Error{Code: wire.CodeLeaseHeld, Key: q.key, Message: q.refusal}
}

// cancelWait withdraws a queued acquire and reports whether that committed.
func (qa *queuedAcquires) cancelWait(id, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), qa.cfg.ApplyTimeout)
	defer cancel()
	_, _, err := qa.propose(ctx, &fsm.CancelWait{LeaseID: id, Key: key})
	return err
}

// observeWait records how long a queued acquire waited since start, and
// whether it was granted.
func (qa *queuedAcquires) observeWait(start time.Time, err error) {
	outcome := "granted"
	if err != nil {
		outcome = "refused"
	}
	qa.metrics.acquireWait.WithLabelValues(outcome).Observe(monoNow().Sub(start).Seconds())
}
