package node

import (
	"context"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fsm"
)

// MaxIdempotencyKeyBytes bounds an idempotency key.
const MaxIdempotencyKeyBytes = 256

// ticks converts a duration in milliseconds to whole ticks, rounding up.
func ticks(ms int64, period time.Duration) uint64 {
	p := period.Milliseconds()
	if ms <= 0 {
		return 0
	}
	return uint64((ms + p - 1) / p)
}

func (n *Node) checkTTL(field string, ms int64) *Error {
	if ms < n.cfg.MinTTL.Milliseconds() || ms > n.cfg.MaxTTL.Milliseconds() {
		return fsm.InvalidField(field, "%s must be %d-%d, got %d", field, n.cfg.MinTTL.Milliseconds(), n.cfg.MaxTTL.Milliseconds(), ms)
	}
	return nil
}

func checkID(kind, id string) *Error {
	if id == "" || len(id) > fsm.MaxIDBytes {
		if kind == "session" {
			return fsm.Errorf(CodeSessionNotFound, "session %q not found", id)
		}
		return fsm.Errorf(CodeLeaseNotFound, "lease %q not found", id)
	}
	return nil
}

func (n *Node) validateAcquire(r *AcquireRequest) *Error {
	if err := fsm.ValidKey(r.Key); err != nil {
		return err
	}
	if strings.HasPrefix(r.Key, ReservedKeyPrefix) {
		return fsm.InvalidField("key", "keys under %q are reserved (the control lease is acquired over the control WebSocket)", ReservedKeyPrefix)
	}
	if r.SessionID == "" || r.Holder != "" {
		if err := fsm.ValidHolder(r.Holder); err != nil {
			return err
		}
	}
	if r.Limit > fsm.MaxLimit {
		return fsm.InvalidField("limit", "limit must be 1-%d, got %d", fsm.MaxLimit, r.Limit)
	}
	if r.SessionID == "" {
		if err := n.checkTTL("ttl_ms", r.TTLMS); err != nil {
			return err
		}
	} else {
		if r.TTLMS != 0 {
			return fsm.InvalidField("ttl_ms", "a lease bound to a session lives as long as the session: omit ttl_ms")
		}
		if len(r.SessionID) > fsm.MaxIDBytes {
			return fsm.Errorf(CodeSessionNotFound, "session %q not found", r.SessionID)
		}
		if r.SessionToken == "" {
			return fsm.InvalidField("session_token", "a session-bound acquire needs the session token (X-Session-Token)")
		}
	}
	if err := fsm.ValidMetadata(r.Metadata); err != nil {
		return err
	}
	if r.WaitMS < 0 || r.WaitMS > n.cfg.MaxWait.Milliseconds() {
		return fsm.InvalidField("wait_ms", "wait_ms must be 0-%d, got %d", n.cfg.MaxWait.Milliseconds(), r.WaitMS)
	}
	if r.LockDelayMS < 0 || r.LockDelayMS > n.cfg.MaxLockDelay.Milliseconds() {
		return fsm.InvalidField("lock_delay_ms", "lock_delay_ms must be 0-%d, got %d", n.cfg.MaxLockDelay.Milliseconds(), r.LockDelayMS)
	}
	if len(r.IdempotencyKey) > MaxIdempotencyKeyBytes {
		return fsm.InvalidField("idempotency_key", "idempotency_key must be at most %d bytes", MaxIdempotencyKeyBytes)
	}
	return nil
}

// Acquire grants a lease, or queues for one when WaitMS > 0. It returns the
// lease with its secret token; replayed is true when an earlier request with
// the same idempotency key and the same parameters created it (the token is
// then the one that request got). Business refusals are *Error values
// (LEASE_HELD with the holders, LIMIT_MISMATCH, LOCK_DELAY, ...).
func (n *Node) Acquire(ctx context.Context, r AcquireRequest) (*Lease, bool, error) {
	if r.Limit == 0 {
		r.Limit = 1
	}
	if err := n.validateAcquire(&r); err != nil {
		return nil, false, err
	}
	period := n.period()
	token := newToken()
	cmd := &fsm.Acquire{
		LeaseID: newID("ls_"), Key: r.Key, Holder: r.Holder, Limit: r.Limit, SessionID: r.SessionID,
		SessionTokenHash: hashToken(r.SessionToken), TokenHash: hashToken(token),
		TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, period), Metadata: r.Metadata,
		WaitTicks: ticks(r.WaitMS, period), LockDelayMS: r.LockDelayMS, WallMS: wallNow().UnixMilli(),
		Quota: n.quota(),
	}
	if r.LockDelayMS > 0 {
		// One extra tick: the delay starts at a tick boundary.
		cmd.LockDelayTicks = ticks(r.LockDelayMS, period) + 1
	}
	var sealKeyBytes []byte
	if r.IdempotencyKey != "" {
		who := r.Holder + "\x00" + r.SessionID
		s := n.sealerFor(who, r.IdempotencyKey)
		cmd.IdemHash = s.idemHash(who, r.IdempotencyKey)
		cmd.Fingerprint = fingerprint(&r, r.Limit)
		sealKeyBytes = s.sealKey(who, r.IdempotencyKey, cmd.Fingerprint)
		cmd.SealedToken = seal(sealKeyBytes, token)
	}
	var wait chan fsm.Notice
	if r.WaitMS > 0 {
		wait = n.addWaiter(cmd.LeaseID)
		defer n.dropWaiter(cmd.LeaseID, wait)
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		if r.WaitMS > 0 && ErrorCode(err) == CodeIndeterminate {
			// The acquire may be queued with nobody left to take the
			// grant: withdraw it, best effort.
			go n.cancelWait(cmd.LeaseID, r.Key)
		}
		return nil, false, err
	}
	if res.Err != nil {
		return nil, false, res.Err
	}
	l := res.Lease
	if res.Queued {
		start := monoNow()
		l, err = n.awaitGrant(ctx, l.ID, r.Key, wait, time.Duration(r.WaitMS)*time.Millisecond)
		outcome := "granted"
		if err != nil {
			outcome = "refused"
		}
		n.metrics.acquireWait.WithLabelValues(outcome).Observe(monoNow().Sub(start).Seconds())
		if err != nil {
			return nil, false, err
		}
	}
	if res.Replayed {
		token = ""
		if t, ok := unseal(sealKeyBytes, l.SealedToken()); ok {
			token = t
		}
	}
	v := n.render(l)
	v.Token = token
	return v, res.Replayed, nil
}

// awaitGrant waits for a queued acquire to be granted or to time out in the
// state machine. If the caller gives up first and no other request (an
// idempotent replay) waits for the same lease, the wait is withdrawn; if the
// withdrawal cannot be confirmed the answer is INDETERMINATE, never a plain
// refusal, because the acquire might still be granted.
func (n *Node) awaitGrant(ctx context.Context, id, key string, wait chan fsm.Notice, d time.Duration) (*fsm.Lease, error) {
	if wait == nil || !n.isOwnWaiter(id, wait) {
		// A replay of a queued request: listen for the original's lease id.
		wait = n.addWaiter(id)
	}
	listening := true
	defer func() {
		if listening {
			n.dropWaiter(id, wait)
		}
	}()
	// The grant may have happened before we started listening.
	if l := n.lookupActive(id); l != nil {
		return l, nil
	}
	local := newClockTimer(d + 3*n.period() + n.cfg.ApplyTimeout)
	defer local.Stop()
	select {
	case no := <-wait:
		if no.Err != nil {
			return nil, no.Err
		}
		return no.Lease, nil
	case <-local.C:
	case <-ctx.Done():
	case <-n.closing:
	}
	listening = false
	if n.dropWaiter(id, wait) > 0 {
		// Another request with the same idempotency key still waits for
		// this lease; leave it queued for that one.
		return nil, &Error{Code: CodeIndeterminate, Message: "gave up waiting; the acquire stays queued for a retry with the same idempotency key"}
	}
	err := n.cancelWait(id, key)
	if l := n.lookupActive(id); l != nil {
		return l, nil
	}
	if err != nil {
		return nil, &Error{Code: CodeIndeterminate, Message: "gave up waiting but could not withdraw the queued acquire; it may still be granted"}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, &Error{Code: CodeLeaseHeld, Key: key, Message: "no slot became free within wait_ms"}
}

// cancelWait withdraws a queued acquire and reports whether that committed.
func (n *Node) cancelWait(id, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ApplyTimeout)
	defer cancel()
	_, _, err := n.propose(ctx, &fsm.CancelWait{LeaseID: id, Key: key})
	return err
}

func (n *Node) isOwnWaiter(id string, ch chan fsm.Notice) bool {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	for _, c := range n.waiters[id] {
		if c == ch {
			return true
		}
	}
	return false
}

func (n *Node) lookupActive(id string) *fsm.Lease {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	if l := n.rep.f.Lease(id); l != nil && l.State == fsm.StateActive {
		return l
	}
	return nil
}

func (n *Node) render(l *fsm.Lease) *Lease {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.view(l, wallNow())
}

func (n *Node) renderSession(s *fsm.Session) *Session {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return sessionView(s, n.rep.f.Tick(), n.rep.period(), wallNow())
}

// Renew extends a standalone lease by its TTL (or by ttlMS, which then
// becomes its TTL). A renewal never shortens a lease.
func (n *Node) Renew(ctx context.Context, id, token string, ttlMS int64) (*Lease, error) {
	if err := checkID("lease", id); err != nil {
		return nil, err
	}
	if IsControlLeaseID(id) {
		return nil, errControlOnly()
	}
	if token == "" {
		return nil, fsm.InvalidField("token", "the lease token (X-Lease-Token) is required")
	}
	cmd := &fsm.Renew{LeaseID: id, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()}
	if ttlMS != 0 {
		if err := n.checkTTL("ttl_ms", ttlMS); err != nil {
			return nil, err
		}
		cmd.TTLMS, cmd.TTLTicks = ttlMS, ticks(ttlMS, n.period())
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.render(res.Lease), nil
}

// Release ends a lease. The lease token authenticates it; for a lease bound
// to a session the session token may be used instead.
func (n *Node) Release(ctx context.Context, r ReleaseRequest) (*Lease, error) {
	if err := checkID("lease", r.LeaseID); err != nil {
		return nil, err
	}
	if IsControlLeaseID(r.LeaseID) {
		return nil, errControlOnly()
	}
	if r.Token == "" && r.SessionToken == "" {
		return nil, fsm.InvalidField("token", "the lease token (X-Lease-Token) or, for a bound lease, the session token is required")
	}
	if err := fsm.ValidReason(r.Reason); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.Release{LeaseID: r.LeaseID, TokenHash: hashToken(r.Token),
		SessionTokenHash: hashToken(r.SessionToken), Reason: r.Reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.render(res.Lease), nil
}

// Revoke force-ends a lease (operator action). Its lock-delay applies.
func (n *Node) Revoke(ctx context.Context, id, reason string) (*Lease, error) {
	if err := checkID("lease", id); err != nil {
		return nil, err
	}
	if IsControlLeaseID(id) {
		return nil, errControlOnly()
	}
	if err := fsm.ValidReason(reason); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.Revoke{LeaseID: id, Reason: reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.render(res.Lease), nil
}

// Heartbeat renews many standalone leases in one log entry. The call fails
// as a whole only on bad input or when the write could not be committed;
// otherwise every item has its own result.
func (n *Node) Heartbeat(ctx context.Context, items []HeartbeatItem) ([]HeartbeatResult, error) {
	if len(items) == 0 || len(items) > fsm.MaxHeartbeatSize {
		return nil, fsm.InvalidField("leases", "a heartbeat carries 1-%d leases, got %d", fsm.MaxHeartbeatSize, len(items))
	}
	cmd := &fsm.Heartbeat{Items: make([]fsm.HeartbeatItem, len(items)), WallMS: wallNow().UnixMilli()}
	out := make([]HeartbeatResult, len(items))
	for i, it := range items {
		if IsControlLeaseID(it.LeaseID) {
			return nil, errControlOnly()
		}
		out[i].LeaseID = it.LeaseID
		cmd.Items[i] = fsm.HeartbeatItem{LeaseID: it.LeaseID, TokenHash: hashToken(it.Token)}
		if it.Token == "" {
			cmd.Items[i].TokenHash = fsm.HashOf("") // never matches a real token
		}
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	now := wallNow()
	n.rep.mu.RLock()
	tick, period := n.rep.f.Tick(), n.rep.period()
	n.rep.mu.RUnlock()
	for i, ir := range res.Items {
		if ir.Err != nil {
			out[i].Error = ir.Err
			continue
		}
		rem := remaining(ir.Lease.ExpiresTick, tick, period)
		at := now.Add(time.Duration(rem) * time.Millisecond).UTC().Truncate(time.Millisecond)
		out[i] = HeartbeatResult{LeaseID: ir.LeaseID, OK: true, FencingToken: ir.Lease.Fence,
			RemainingMS: rem, ExpiresAt: &at, RenewalCount: ir.Lease.RenewalCount}
	}
	return out, nil
}

// CreateSession creates a session and returns it with its secret token.
func (n *Node) CreateSession(ctx context.Context, r SessionRequest) (*Session, error) {
	if err := fsm.ValidHolder(r.Holder); err != nil {
		return nil, err
	}
	if err := n.checkTTL("ttl_ms", r.TTLMS); err != nil {
		return nil, err
	}
	if err := fsm.ValidMetadata(r.Metadata); err != nil {
		return nil, err
	}
	token := newToken()
	res, _, err := n.propose(ctx, &fsm.SessionCreate{SessionID: newID("ss_"), Holder: r.Holder,
		TokenHash: hashToken(token), TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, n.period()),
		Metadata: r.Metadata, WallMS: wallNow().UnixMilli(), Quota: n.quota()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	v := n.renderSession(res.Session)
	v.Token = token
	return v, nil
}

// SessionHeartbeat renews a session and so every lease bound to it. A
// heartbeat on an ended session fails with SESSION_ENDED (counted as late).
func (n *Node) SessionHeartbeat(ctx context.Context, id, token string) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	if token == "" {
		return nil, fsm.InvalidField("session_token", "the session token (X-Session-Token) is required")
	}
	res, _, err := n.propose(ctx, &fsm.SessionHeartbeat{SessionID: id, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if res.Err.Code == CodeSessionEnded {
			n.stats.lateHeartbeats.Add(1)
		}
		return nil, res.Err
	}
	return n.renderSession(res.Session), nil
}

// EndSession ends a session; every lease bound to it is released with
// reason "session_ended". The session token is required unless force (an
// admin request) is set.
func (n *Node) EndSession(ctx context.Context, id, token string, force bool) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	if token == "" && !force {
		return nil, fsm.InvalidField("session_token", "the session token (X-Session-Token) is required")
	}
	res, _, err := n.propose(ctx, &fsm.SessionEnd{SessionID: id, TokenHash: hashToken(token), Force: force, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.renderSession(res.Session), nil
}

// ReleaseHolder ends every active lease (revoked, reason
// "holder_released", no lock-delay) and session of holder at once, and
// returns how many it ended.
func (n *Node) ReleaseHolder(ctx context.Context, holder, reason string) (int, error) {
	if err := fsm.ValidHolder(holder); err != nil {
		return 0, err
	}
	if err := fsm.ValidReason(reason); err != nil {
		return 0, err
	}
	res, _, err := n.propose(ctx, &fsm.ReleaseHolder{Holder: holder, Reason: reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return 0, err
	}
	if res.Err != nil {
		return 0, res.Err
	}
	return res.Count, nil
}

// quota is the count limits of the configuration, carried in the commands
// that create leases and sessions (the state machine enforces them).
func (n *Node) quota() fsm.Quota {
	return fsm.Quota{
		Leases: uint64(n.cfg.MaxLeases), HolderLeases: uint64(n.cfg.MaxLeasesPerHolder),
		Sessions: uint64(n.cfg.MaxSessions), HolderSessions: uint64(n.cfg.MaxSessionsPerHolder),
		KeyWaiters: uint64(n.cfg.MaxWaitersPerKey), HolderWaiters: uint64(n.cfg.MaxWaitersPerHolder),
	}
}
