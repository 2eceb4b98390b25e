package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// ErrNotRenewed is the reason a KeepAlive reports its lease lost when no
// renewal succeeded before the holder's deadline (the server unreachable,
// no leader, every attempt failing). The lease may still be active on the
// server; it expires by itself unless released.
var ErrNotRenewed = errors.New("client: lease not renewed before the holder's deadline")

// ErrKeepAliveStopped is the reason of a KeepAlive ended by Stop or Release.
var ErrKeepAliveStopped = errors.New("client: keep-alive stopped")

// MinMargin is the smallest default safety margin of a KeepAlive (see
// KeepAliveOptions.Margin).
const MinMargin = 100 * time.Millisecond

// DefaultMargin is the safety margin a KeepAlive uses for a lease of the
// given TTL when KeepAliveOptions.Margin is 0: TTL/10, at least MinMargin,
// at most TTL/2. It leaves the holder time to notice the loss and stop
// (scheduling delays, aborting work in flight) before the server could end
// the lease, and covers any difference in rate between the holder's and
// the leader's clocks many times over.
func DefaultMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, MinMargin), ttl/2)
}

// KeepAliveOptions tunes a KeepAlive. The zero value is the recommended
// setting.
type KeepAliveOptions struct {
	// Interval is the time between the send times of two renewals. 0
	// means the lease's heartbeat_interval_ms, at most TTL/3, so that two
	// renewals can fail before the lease is at risk. It must be less than
	// TTL - Margin.
	Interval time.Duration
	// Margin is how long before the earliest instant the server could end
	// the lease Lost fires. 0 means DefaultMargin(TTL); negative means no
	// margin at all. It must be less than the TTL.
	Margin time.Duration
	// RenewTimeout bounds one attempt of a renewal against one node; an
	// attempt that runs out moves on to the client's next address. 0
	// means Interval. A renewal as a whole never outlives the deadline,
	// and the loss report never waits for it.
	RenewTimeout time.Duration
	// OnRenewError, if set, is called with each failed renewal that does
	// not end the keep-alive (it is retried until the deadline). It runs
	// on a background goroutine and delays the next renewal, never the
	// loss report; it must return (Stop waits for it).
	OnRenewError func(err error)
	// Grant: each renewal of a standalone lease (KeepAlive,
	// AcquireKeepAlive) asks for a grant of the lease, which the answer
	// passed to OnRenew carries.
	Grant bool
	// OnRenew, if set, is called with the answer of each successful
	// renewal (with AcquireKeepAlive, first with the acquire's answer,
	// before it returns), e.g. to hand the current grant on. It runs on a
	// background goroutine before the renewal counts, delays the next
	// renewal (never the loss report), and must return.
	OnRenew func(l *wire.Lease)
}

// KeepAlive keeps one standalone lease renewed and tracks, on the holder's
// own monotonic clock, until when the holder may rely on it.
//
// The server starts a TTL no earlier than it receives the request, and its
// ticks never run faster than real time, so a lease acquired or renewed by
// a request sent at s cannot end before s + TTL (see the time model in
// docs/design.md). KeepAlive keeps that bound from the send time of the last
// successful acquire or renewal (never from the time an answer arrived, and
// never from expires_at) and closes Lost at the bound minus the margin at
// the latest: from a timer, whether or not a renewal is still in flight or
// the server answers at all. Once Lost is closed the holder must stop
// touching the resource; before, nobody else can have been granted the
// lease.
//
// A KeepAlive is safe for concurrent use.
type KeepAlive struct {
	r                 Renewer
	id, key           string
	fencing           uint64
	ttl, margin       time.Duration
	interval, timeout time.Duration
	retry             time.Duration // the longest wait before retrying a failed renewal
	onErr             func(error)
	onRenew           func(*wire.Lease)

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	lost     chan struct{}
	ctx      context.Context
	cancel   context.CancelCauseFunc

	mu     sync.Mutex
	expiry time.Time // earliest instant the server could end the lease
	err    error     // set once, when lost closes
}

// KeepAlive starts keeping lease renewed (POST /v1/leases/:id/renew with
// its Token, without changing its TTL) until ctx ends, Stop or Release is
// called, or the lease is lost. lease is the answer of the acquire or
// renewal that was sent at sent: the time.Now() taken just before sending
// it, with its monotonic clock reading. A later sent makes the deadline
// unsafe; an earlier one only makes it conservative. lease must be an
// active standalone lease with its LeaseID, Token and TTLMS; a lease bound
// to a session is kept alive by the session's heartbeat instead.
//
// The error is about the arguments only; everything after that is reported
// through Lost and Err. If the deadline has already passed, Lost is closed
// at once: after an acquire that waited for its slot, use AcquireKeepAlive,
// which renews first.
//
// ctx bounds the keep-alive's whole life.
func (c *Client) KeepAlive(ctx context.Context, lease *wire.Lease, sent time.Time, opts KeepAliveOptions) (*KeepAlive, error) {
	if lease == nil || lease.LeaseID == "" || lease.Token == "" {
		return nil, errors.New("client: keep-alive needs a lease with its id and token")
	}
	if lease.SessionID != "" {
		return nil, errors.New("client: keep-alive of a session-bound lease: heartbeat the session instead")
	}
	if lease.State != "" && lease.State != "active" {
		return nil, fmt.Errorf("client: keep-alive of a lease that is %s", lease.State)
	}
	if sent.IsZero() {
		return nil, errors.New("client: keep-alive needs the send time of the acquire or renewal")
	}
	return KeepAliveWith(ctx, leaseRenewer{c, lease.LeaseID, lease.Token, opts.Grant}, lease, sent, opts)
}

// Renewer renews one thing a KeepAlive keeps alive: a lease through this
// package's Client, a lease on an embedded node, a session. Both methods
// must be safe for concurrent use.
type Renewer interface {
	// Renew renews once without changing the TTL and returns the answer:
	// at least its State, and TTLMS and RemainingMS when known (a session
	// answers with its own). attempt bounds one attempt against one node
	// (ignored where there is only one); ctx bounds the whole renewal.
	// The errors that end the keep-alive are the contract's LEASE_EXPIRED,
	// LEASE_RELEASED, LEASE_REVOKED, LEASE_TOKEN_INVALID, LEASE_NOT_FOUND,
	// SESSION_NOT_FOUND and SESSION_ENDED; any other is retried until the
	// deadline. A renewal sent twice must be harmless (it only pushes the
	// end later), since it may be retried on another node.
	Renew(ctx context.Context, attempt time.Duration) (*wire.Lease, error)
	// Release gives the lease (or session) back, with a reason that may
	// be empty.
	Release(ctx context.Context, reason string) error
}

// KeepAliveWith is KeepAlive for a lease renewed by r instead of by this
// package's HTTP client: a lease on an embedded node, or a session (see
// KeepAliveSession). lease describes the thing kept alive as answered by
// the request sent at sent: LeaseID and Key name it, TTLMS (required),
// RemainingMS and HeartbeatIntervalMS time it, FencingToken is reported
// by FencingToken. The deadline rule is KeepAlive's.
func KeepAliveWith(ctx context.Context, r Renewer, lease *wire.Lease, sent time.Time, opts KeepAliveOptions) (*KeepAlive, error) {
	if r == nil || lease == nil {
		return nil, errors.New("client: keep-alive needs a renewer and a lease")
	}
	if sent.IsZero() {
		return nil, errors.New("client: keep-alive needs the send time of the acquire or renewal")
	}
	k, err := newKeepAlive(r, time.Duration(lease.TTLMS)*time.Millisecond, lease.HeartbeatIntervalMS, opts)
	if err != nil {
		return nil, err
	}
	k.id, k.key, k.fencing = lease.LeaseID, lease.Key, lease.FencingToken
	k.onRenew = opts.OnRenew
	k.expiry = sent.Add(k.granted(lease))
	k.start(ctx, sent)
	return k, nil
}

// leaseRenewer renews a standalone lease through a Client.
type leaseRenewer struct {
	c         *Client
	id, token string
	grant     bool // ask for a grant with each renewal
}

func (r leaseRenewer) Renew(ctx context.Context, attempt time.Duration) (*wire.Lease, error) {
	return r.c.renewRetrying(ctx, r.id, r.token, attempt, r.grant)
}

func (r leaseRenewer) Release(ctx context.Context, reason string) error {
	_, err := r.c.Release(ctx, wire.ReleaseRequest{LeaseID: r.id, Token: r.token, Reason: reason})
	return err
}

// AcquireKeepAlive acquires a standalone lease (req.TTLMS set, no session)
// and keeps it alive as KeepAlive does, taking the acquire's send time
// itself. If waiting for the lease (req.WaitMS) used up more than half of
// the time the holder may rely on it, it renews once before returning; if
// that fails it releases the lease, best effort, and returns the error.
// Set req.IdempotencyKey to let the acquire fail over between nodes. ctx
// bounds the acquire and then the keep-alive's whole life.
func (c *Client) AcquireKeepAlive(ctx context.Context, req wire.AcquireRequest, opts KeepAliveOptions) (*KeepAlive, error) {
	if req.SessionID != "" || req.TTLMS <= 0 {
		return nil, errors.New("client: keep-alive needs a standalone lease with ttl_ms")
	}
	// Check the options before anything is acquired.
	if _, err := newKeepAlive(nil, time.Duration(req.TTLMS)*time.Millisecond, 0, opts); err != nil {
		return nil, err
	}
	sent := time.Now()
	lease, err := c.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	probe, err := newKeepAlive(nil, time.Duration(lease.TTLMS)*time.Millisecond, lease.HeartbeatIntervalMS, opts)
	if err != nil {
		c.releaseQuietly(ctx, lease, "keep-alive: invalid lease")
		return nil, err
	}
	window := probe.ttl - probe.margin
	if time.Until(sent.Add(probe.granted(lease)-probe.margin)) < window/2 {
		resent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, resent.Add(window))
		l, err := c.renewRetrying(rctx, lease.LeaseID, lease.Token, probe.timeout, opts.Grant)
		cancel()
		if err == nil && l.State != "" && l.State != "active" {
			err = stateError(lease.LeaseID, l.State)
		}
		if err != nil {
			c.releaseQuietly(ctx, lease, "keep-alive: not renewed in time after acquiring")
			return nil, fmt.Errorf("client: lease %s acquired but not renewed in time: %w", lease.LeaseID, err)
		}
		sent, lease.RemainingMS = resent, l.RemainingMS
		if l.TTLMS > 0 {
			lease.TTLMS = l.TTLMS
		}
		if l.Grant != "" {
			lease.Grant = l.Grant
		}
	}
	if opts.OnRenew != nil {
		opts.OnRenew(lease)
	}
	return c.KeepAlive(ctx, lease, sent, opts)
}

func (c *Client) releaseQuietly(ctx context.Context, lease *wire.Lease, reason string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = c.Release(rctx, wire.ReleaseRequest{LeaseID: lease.LeaseID, Token: lease.Token, Reason: reason})
}

// newKeepAlive checks the options against the TTL and fills in defaults;
// hbMS is the lease's suggested heartbeat interval (0 if unknown).
func newKeepAlive(r Renewer, ttl time.Duration, hbMS int64, opts KeepAliveOptions) (*KeepAlive, error) {
	if ttl <= 0 {
		return nil, errors.New("client: keep-alive needs the lease's ttl_ms")
	}
	k := &KeepAlive{r: r, ttl: ttl, margin: opts.Margin, interval: opts.Interval, timeout: opts.RenewTimeout, onErr: opts.OnRenewError}
	switch {
	case k.margin == 0:
		k.margin = DefaultMargin(ttl)
	case k.margin < 0:
		k.margin = 0
	}
	if k.margin >= ttl {
		return nil, fmt.Errorf("client: keep-alive margin %v not below the TTL %v", k.margin, ttl)
	}
	if k.interval == 0 {
		k.interval = ttl / 3
		if hb := time.Duration(hbMS) * time.Millisecond; hb > 0 && hb < k.interval {
			k.interval = hb
		}
	}
	if k.interval <= 0 || k.interval >= ttl-k.margin {
		return nil, fmt.Errorf("client: keep-alive interval %v must be positive and below TTL - margin (%v)", k.interval, ttl-k.margin)
	}
	if k.timeout <= 0 {
		k.timeout = k.interval
	}
	k.retry = min(max(k.interval/4, retryBase), time.Second)
	return k, nil
}

// granted is how long after its send time a request that answered l
// guarantees the lease: the TTL, or less if the answer says less.
func (k *KeepAlive) granted(l *wire.Lease) time.Duration {
	g := k.ttl
	if l.TTLMS > 0 {
		g = min(g, time.Duration(l.TTLMS)*time.Millisecond)
	}
	if l.RemainingMS > 0 {
		g = min(g, time.Duration(l.RemainingMS)*time.Millisecond)
	}
	return g
}

func (k *KeepAlive) start(ctx context.Context, sent time.Time) {
	k.stop, k.done, k.lost = make(chan struct{}), make(chan struct{}), make(chan struct{})
	k.ctx, k.cancel = context.WithCancelCause(ctx)
	go k.run(ctx, sent)
}

// LeaseID returns the id of the lease kept alive.
func (k *KeepAlive) LeaseID() string { return k.id }

// Key returns the key of the lease kept alive.
func (k *KeepAlive) Key() string { return k.key }

// FencingToken returns the lease's fencing token, to pass with every access
// to the guarded resource (see FenceGuard). Renewals never change it.
func (k *KeepAlive) FencingToken() uint64 { return k.fencing }

// Deadline returns the instant Lost closes unless a renewal succeeds
// before: the earliest instant the server could end the lease, minus the
// margin. It only moves forward; after Lost has closed it stays where it
// was. It carries a monotonic clock reading: compare it with time.Now, not
// with wall-clock times from elsewhere.
func (k *KeepAlive) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.expiry.Add(-k.margin)
}

// Lost returns a channel that is closed when the holder may no longer rely
// on the lease: at the deadline without a successful renewal, when the
// server says the lease is gone, when the context given to KeepAlive ends,
// or when Stop or Release is called. Err tells which.
func (k *KeepAlive) Lost() <-chan struct{} { return k.lost }

// Err returns nil while the lease is kept alive, then why Lost closed:
// ErrNotRenewed (wrapped, with the last renewal failure in its text), the
// server's *APIError (ErrorCode LEASE_EXPIRED, LEASE_RELEASED,
// LEASE_REVOKED, LEASE_TOKEN_INVALID or LEASE_NOT_FOUND), a *wire.Error
// with one of the first three codes when a renewal answered a lease that
// is no longer active, the context's error (wrapped), or
// ErrKeepAliveStopped.
func (k *KeepAlive) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Context returns a context derived from the one given to KeepAlive that
// is cancelled, with Err as its cause, when Lost closes: pass it to the
// work done under the lease.
func (k *KeepAlive) Context() context.Context { return k.ctx }

// Stop stops renewing without releasing the lease, which then expires by
// itself; Lost closes with ErrKeepAliveStopped if it is not closed yet.
// When Stop returns no renewal is sent any more (one already sent may still
// be applied). Calling it again, or after a loss, is harmless.
func (k *KeepAlive) Stop() {
	k.stopOnce.Do(func() { close(k.stop) })
	<-k.done
}

// Release stops renewing, closes Lost (so that work watching it stops
// first), then releases the lease on the server (DELETE /v1/leases/:id)
// with the given reason, which may be empty. Releasing a lease that is
// already gone returns the server's error (LEASE_EXPIRED, say).
func (k *KeepAlive) Release(ctx context.Context, reason string) error {
	k.Stop()
	return k.r.Release(ctx, reason)
}

// lose records why the lease is lost and closes Lost, once.
func (k *KeepAlive) lose(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return
	}
	k.err = err
	close(k.lost)
	k.cancel(err)
}

type renewResult struct {
	sent  time.Time
	lease *wire.Lease
	err   error
}

// run renews until the lease is lost or the keep-alive is stopped. The
// loss timer lives here, never behind a request: renewals run on their
// own goroutine.
func (k *KeepAlive) run(ctx context.Context, sent time.Time) {
	defer close(k.done)
	inner, cancel := context.WithCancel(ctx)
	results := make(chan renewResult, 1)
	renewing := false
	defer func() {
		cancel()
		if renewing {
			<-results
		}
	}()
	deadline := k.Deadline()
	lossT := time.NewTimer(time.Until(deadline))
	defer lossT.Stop()
	renewT := time.NewTimer(k.untilRenewal(sent, deadline))
	defer renewT.Stop()
	// A failed renewal is retried sooner than the next interval, after a
	// jittered backoff up to k.retry: holders whose renewals failed at the
	// same instant (the leader went away) do not retry in lockstep.
	retry := Backoff{Base: min(retryBase, k.retry), Max: k.retry, Rand: backoffRand}
	var lastErr error
	notRenewed := func() error {
		if lastErr == nil {
			return ErrNotRenewed
		}
		return fmt.Errorf("%w (last renewal: %v)", ErrNotRenewed, lastErr)
	}
	for {
		if !time.Now().Before(deadline) {
			k.lose(notRenewed())
			return
		}
		select {
		case <-k.stop:
			k.lose(ErrKeepAliveStopped)
			return
		case <-ctx.Done():
			k.lose(fmt.Errorf("client: keep-alive: %w", context.Cause(ctx)))
			return
		case <-lossT.C:
			// Checked at the top of the loop.
			lossT.Reset(time.Until(deadline))
		case <-renewT.C:
			if renewing {
				continue
			}
			renewing = true
			go func(sent, deadline time.Time) {
				rctx, cancel := context.WithDeadline(inner, deadline)
				l, err := k.r.Renew(rctx, k.timeout)
				cancel()
				if err != nil && k.onErr != nil && inner.Err() == nil && !leaseGone(err) {
					k.onErr(err)
				}
				if err == nil && k.onRenew != nil && (l.State == "" || l.State == "active") {
					k.onRenew(l)
				}
				results <- renewResult{sent, l, err}
			}(time.Now(), deadline)
		case r := <-results:
			renewing = false
			switch {
			case r.err == nil && r.lease.State != "" && r.lease.State != "active":
				k.lose(stateError(k.id, r.lease.State))
				return
			case r.err == nil:
				if !time.Now().Before(deadline) {
					continue // too late: lost at the top of the loop
				}
				k.mu.Lock()
				if e := r.sent.Add(k.granted(r.lease)); e.After(k.expiry) {
					k.expiry = e
				}
				k.mu.Unlock()
				deadline = k.Deadline()
				lossT.Reset(time.Until(deadline))
				renewT.Reset(k.untilRenewal(r.sent, deadline))
				lastErr = nil
				retry.Reset()
			case leaseGone(r.err):
				k.lose(r.err)
				return
			default:
				lastErr = r.err
				renewT.Reset(retry.Next())
			}
		}
	}
}

// retryBase is the shortest backoff ceiling of a renewal retry.
const retryBase = 50 * time.Millisecond

// untilRenewal is the wait before the next renewal after one sent at sent:
// one interval, or half the time left before the deadline if that is
// sooner (a lease that came with less than its TTL left).
func (k *KeepAlive) untilRenewal(sent, deadline time.Time) time.Duration {
	return min(time.Until(sent.Add(k.interval)), time.Until(deadline)/2)
}

// renewRetrying renews without changing the TTL, moving on to the next
// address after a transport failure, an attempt that ran out of timeout, or
// a 503. Unlike Renew in general this is safe: a duplicate renewal of the
// same lease with the same token and no TTL only pushes the lease's end
// later, and a holder counting from the first copy's send time has a
// deadline before either copy's end.
func (c *Client) renewRetrying(ctx context.Context, leaseID, token string, attempt time.Duration, grant bool) (*wire.Lease, error) {
	var body any
	if grant { // a grant changes nothing on the server: as safe to resend
		body = map[string]bool{"grant": true}
	}
	return doNew[wire.Lease](ctx, c, call{
		method:  http.MethodPost,
		path:    "/v1/leases/" + escape(leaseID) + "/renew",
		header:  headers("X-Lease-Token", token),
		body:    body,
		retry:   retrySafe,
		timeout: attempt,
	})
}

// leaseGone reports whether a renewal error means the lease is over for
// this holder, so retrying cannot help.
func leaseGone(err error) bool {
	switch ErrorCode(err) {
	case wire.CodeLeaseExpired, wire.CodeLeaseReleased, wire.CodeLeaseRevoked,
		wire.CodeLeaseTokenInvalid, wire.CodeLeaseNotFound,
		wire.CodeSessionNotFound, wire.CodeSessionEnded:
		return true
	}
	return false
}

// stateError describes a renewal answered with a lease no longer active.
func stateError(id, state string) error {
	code := wire.CodeLeaseExpired
	switch state {
	case "released":
		code = wire.CodeLeaseReleased
	case "revoked":
		code = wire.CodeLeaseRevoked
	case "ended":
		code = wire.CodeSessionEnded
	}
	return &wire.Error{Code: code, Message: fmt.Sprintf("lease %s is %s", id, state)}
}
