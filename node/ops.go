package node

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
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

func (c *Config) checkTTL(field string, ms int64) *wire.Error {
	if ms < c.MinTTL.Milliseconds() || ms > c.MaxTTL.Milliseconds() {
		return wire.OutOfRange(field, c.MinTTL.Milliseconds(), c.MaxTTL.Milliseconds(), ms, "")
	}
	return nil
}

func checkID(kind, id string) *wire.Error {
	if id == "" || len(id) > fsm.MaxIDBytes {
		if kind == "session" {
			return fsm.Errorf(wire.CodeSessionNotFound, "session %q not found", id)
		}
		return fsm.Errorf(wire.CodeLeaseNotFound, "lease %q not found", id)
	}
	return nil
}

func (c *Config) validateAcquire(r *wire.AcquireRequest) *wire.Error {
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
		return wire.OutOfRange("limit", 1, fsm.MaxLimit, int64(r.Limit), "")
	}
	if r.SessionID == "" {
		if err := c.checkTTL("ttl_ms", r.TTLMS); err != nil {
			return err
		}
	} else {
		if r.TTLMS != 0 {
			return fsm.InvalidField("ttl_ms", "a lease bound to a session lives as long as the session: omit ttl_ms")
		}
		if len(r.SessionID) > fsm.MaxIDBytes {
			return fsm.Errorf(wire.CodeSessionNotFound, "session %q not found", r.SessionID)
		}
		if r.SessionToken == "" {
			return fsm.InvalidField("session_token", "a session-bound acquire needs the session token (X-Session-Token)")
		}
	}
	if err := fsm.ValidMetadata(r.Metadata); err != nil {
		return err
	}
	if r.WaitMS < 0 || r.WaitMS > c.MaxWait.Milliseconds() {
		return wire.OutOfRange("wait_ms", 0, c.MaxWait.Milliseconds(), r.WaitMS, "")
	}
	if r.LockDelayMS < 0 || r.LockDelayMS > c.MaxLockDelay.Milliseconds() {
		return wire.OutOfRange("lock_delay_ms", 0, c.MaxLockDelay.Milliseconds(), r.LockDelayMS, "")
	}
	if len(r.IdempotencyKey) > MaxIdempotencyKeyBytes {
		return fsm.InvalidField("idempotency_key", "idempotency_key must be at most %d bytes", MaxIdempotencyKeyBytes)
	}
	return nil
}

// Acquire grants a lease, or queues for one when WaitMS > 0. It returns the
// lease with its secret token; replayed is true when an earlier request with
// the same idempotency key and the same parameters created it (the token is
// then the one that request got; the lease is rendered as it reads now,
// so a replay after it ended, or fell due, answers it ended, not live).
// Business refusals are *Error values (LEASE_HELD with the holders,
// LIMIT_MISMATCH, LOCK_DELAY, ...).
func (n *Node) Acquire(ctx context.Context, r wire.AcquireRequest) (*wire.Lease, bool, error) {
	r.Limit = cmp.Or(r.Limit, 1)
	if err := n.cfg.validateAcquire(&r); err != nil {
		return nil, false, err
	}
	if err := n.disk.growthRefused(); err != nil {
		return nil, false, err
	}
	if canaryDataRace {
		canaryAcquires++
	}
	if canaryWritesStuck {
		if p := n.lt.readyTerm(); p != nil && p.canaryStuck {
			return nil, false, &wire.Error{Code: wire.CodeUnavailable, Message: "canary_writes_stuck: this leader grants nothing"}
		}
	}
	if r.Grant {
		if err := n.gk.usable(); err != nil {
			return nil, false, err
		}
	}
	period := n.tk.period()
	token := newToken()
	cmd := &fsm.Acquire{
		LeaseID: newID("ls_"), Key: r.Key, Holder: r.Holder, Limit: r.Limit, SessionID: r.SessionID,
		SessionTokenHash: hashToken(r.SessionToken), TokenHash: hashToken(token),
		TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, period), Metadata: r.Metadata,
		WaitTicks: ticks(r.WaitMS, period), LockDelayMS: r.LockDelayMS, WallMS: wallNow().UnixMilli(),
		Quota: n.cfg.quota(),
	}
	if r.LockDelayMS > 0 {
		// One extra tick: the delay starts at a tick boundary.
		cmd.LockDelayTicks = ticks(r.LockDelayMS, period) + 1
	}
	var sealKeyBytes []byte
	if r.IdempotencyKey != "" {
		cmd.Fingerprint = fingerprint(&r, r.Limit)
		cmd.IdemHash, cmd.SealedToken, sealKeyBytes = n.sg.sealIdempotent(r.Holder, r.SessionID, r.IdempotencyKey, cmd.Fingerprint, token)
	}
	var wait chan fsm.Notice
	if r.WaitMS > 0 {
		wait = n.waits.add(cmd.LeaseID)
		defer n.waits.drop(cmd.LeaseID, wait)
	}
	res, err := n.proposeAcquire(ctx, cmd, r.WaitMS, cmd.LeaseID, r.Key)
	if err != nil {
		return nil, false, err
	}
	l := res.Lease
	if res.Queued {
		start := monoNow()
		l, err = n.queued.awaitGrant(ctx, l.ID, r.Key, wait, time.Duration(r.WaitMS)*time.Millisecond)
		n.queued.observeWait(start, err)
		if err != nil {
			return nil, false, err
		}
	}
	v := n.rep.render(l)
	v.Token = answerToken(res.Replayed, token, sealKeyBytes, l)
	if r.Grant {
		n.gk.attach(v)
	}
	return v, res.Replayed, nil
}

// proposeAcquire proposes an acquire of a lease or a group (leaseID, key:
// its first member); a refusal is the error. One that may be queued
// (waitMS > 0) with nobody left to take the grant is withdrawn, best effort.
func (n *Node) proposeAcquire(ctx context.Context, cmd fsm.Command, waitMS int64, leaseID, key string) (fsm.Result, error) {
	res, _, err := n.propose(ctx, cmd)
	if err != nil && waitMS > 0 && wire.ErrorCode(err) == wire.CodeIndeterminate {
		go n.queued.cancelWait(leaseID, key)
	}
	if err == nil && res.Err != nil {
		err = res.Err
	}
	return res, err
}

// answerToken is an acquire's token: its own, or a replay's original one,
// unsealed from l ("" if it cannot be).
func answerToken(replayed bool, token string, sealKey []byte, l *fsm.Lease) string {
	if !replayed {
		return token
	}
	if t, ok := unseal(sealKey, l.SealedToken()); ok {
		return t
	}
	return ""
}

func (r *replica) render(l *fsm.Lease) *wire.Lease {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.view(l, wallNow())
}

func (r *replica) renderSession(s *fsm.Session) *wire.Session {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return sessionView(s, r.f.Tick(), r.period(), wallNow())
}

// Renew extends a standalone lease by its TTL (or by ttlMS, which then
// becomes its TTL). A renewal never shortens a lease.
func (n *Node) Renew(ctx context.Context, id, token string, ttlMS int64) (*wire.Lease, error) {
	return n.RenewWith(ctx, wire.RenewRequest{LeaseID: id, Token: token, TTLMS: ttlMS})
}

// RenewWith is Renew with metadata: r.Metadata, if not nil, replaces the
// lease's metadata with the renewal, if it succeeds (empty clears it). A
// lease bound to a session takes a renewal only with metadata (and no TTL):
// it changes its metadata, and its session keeps it alive. Metadata needs
// every server of the cluster to run a version that reads it
// (serversRead), else the renewal is refused with UNAVAILABLE.
func (n *Node) RenewWith(ctx context.Context, r wire.RenewRequest) (*wire.Lease, error) {
	cmd, err := n.renewCommand(r)
	if err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return n.renewed(r, res)
}

// Renewed is one renewal's outcome (RenewMany): the lease, or an error.
type Renewed struct {
	Lease *wire.Lease
	Err   error
}

// RenewMany renews several leases as RenewWith does each, and answers each
// in out (len(out) == len(reqs)): a request refused before it is proposed
// gets its own error, and the others are proposed together as one unit
// (one hand-off to the batcher, one log entry), so that a failed write is
// the error of each of them (none is applied, or it is INDETERMINATE for
// each) and otherwise each has its own result. Up to Config.MaxBatch
// renewals share a unit; more take several, one after another.
func (n *Node) RenewMany(ctx context.Context, reqs []wire.RenewRequest, out []Renewed) {
	for len(reqs) > n.cfg.MaxBatch {
		n.RenewMany(ctx, reqs[:n.cfg.MaxBatch], out[:n.cfg.MaxBatch])
		reqs, out = reqs[n.cfg.MaxBatch:], out[n.cfg.MaxBatch:]
	}
	cmds := make([]fsm.Command, 0, len(reqs))
	for i, r := range reqs {
		cmd, err := n.renewCommand(r)
		out[i] = Renewed{Err: err}
		if err == nil {
			cmds = append(cmds, cmd)
		}
	}
	if len(cmds) == 0 {
		return
	}
	results, _, err := n.proposeUnit(ctx, cmds)
	j := 0
	for i, r := range reqs {
		if out[i].Err != nil {
			continue
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Lease, out[i].Err = n.renewed(r, results[j])
		j++
	}
}

// renewCommand is the command of renewal r, or why r is refused.
func (n *Node) renewCommand(r wire.RenewRequest) (*fsm.Renew, error) {
	if err := checkID("lease", r.LeaseID); err != nil {
		return nil, err
	}
	if IsControlLeaseID(r.LeaseID) {
		return nil, errControlOnly()
	}
	if r.Token == "" {
		return nil, fsm.InvalidField("token", "the lease token (X-Lease-Token) is required")
	}
	cmd := &fsm.Renew{LeaseID: r.LeaseID, TokenHash: hashToken(r.Token), WallMS: wallNow().UnixMilli()}
	if r.TTLMS != 0 {
		if err := n.cfg.checkTTL("ttl_ms", r.TTLMS); err != nil {
			return nil, err
		}
		cmd.TTLMS, cmd.TTLTicks = r.TTLMS, ticks(r.TTLMS, n.tk.period())
	}
	if r.Metadata != nil {
		if err := fsm.ValidMetadata(r.Metadata); err != nil {
			return nil, err
		}
		if err := n.serversRead("a renewal with metadata", func(p cluster.Peer) bool { return p.RenewMeta }); err != nil {
			return nil, err
		}
		cmd.Metadata, cmd.SetMetadata = r.Metadata, true
	}
	if r.Grant {
		if err := n.gk.usable(); err != nil {
			return nil, err
		}
	}
	return cmd, nil
}

// renewed is renewal r's answer from its result.
func (n *Node) renewed(r wire.RenewRequest, res fsm.Result) (*wire.Lease, error) {
	if res.Err != nil {
		return nil, res.Err
	}
	v := n.rep.render(res.Lease)
	if r.Grant {
		n.gk.attach(v)
	}
	return v, nil
}

// serversRead refuses an entry (what) while a server of the configuration
// runs a version that does not read such entries (it would stop on them):
// gossip says which do (reads).
func (n *Node) serversRead(what string, reads func(cluster.Peer) bool) error {
	ids, err := n.cl.ServerIDs()
	if err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "read the configuration: " + err.Error()}
	}
	if n.cfg.olderPeer || !n.mem.EveryServer(ids, reads) {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "a server of the cluster runs an older version that cannot apply " +
			what + " (or is not known to gossip yet); upgrade every server first, or retry shortly; nothing changed"}
	}
	return nil
}

// Release ends a lease. The lease token authenticates it; for a lease bound
// to a session the session token may be used instead.
func (n *Node) Release(ctx context.Context, r wire.ReleaseRequest) (*wire.Lease, error) {
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
	return n.rep.render(res.Lease), nil
}

// Revoke force-ends a lease (operator action). Its lock-delay applies.
func (n *Node) Revoke(ctx context.Context, id, reason string) (*wire.Lease, error) {
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
	return n.rep.render(res.Lease), nil
}

// Heartbeat renews many standalone leases in one log entry. The call fails
// as a whole only on bad input or when the write could not be committed;
// otherwise every item has its own result.
func (n *Node) Heartbeat(ctx context.Context, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error) {
	if len(items) == 0 || len(items) > fsm.MaxHeartbeatSize {
		return nil, fsm.InvalidField("leases", "a heartbeat carries 1-%d leases, got %d", fsm.MaxHeartbeatSize, len(items))
	}
	cmd := &fsm.Heartbeat{Items: make([]fsm.HeartbeatItem, len(items)), WallMS: wallNow().UnixMilli()}
	out := make([]wire.HeartbeatResult, len(items))
	meta := false
	for i, it := range items {
		if IsControlLeaseID(it.LeaseID) {
			return nil, errControlOnly()
		}
		out[i].LeaseID = it.LeaseID
		cmd.Items[i] = fsm.HeartbeatItem{LeaseID: it.LeaseID, TokenHash: hashToken(it.Token)}
		if it.Token == "" {
			cmd.Items[i].TokenHash = fsm.HashOf("") // never matches a real token
		}
		if it.Metadata != nil {
			if err := fsm.ValidMetadata(it.Metadata); err != nil {
				return nil, &wire.Error{Code: err.Code, Field: err.Field, Message: fmt.Sprintf("leases[%d]: %s", i, err.Message)}
			}
			cmd.Items[i].Metadata, cmd.Items[i].SetMetadata = it.Metadata, true
			meta = true
		}
	}
	if meta {
		if err := n.serversRead("a renewal with metadata", func(p cluster.Peer) bool { return p.RenewMeta }); err != nil {
			return nil, err
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
		out[i] = wire.HeartbeatResult{LeaseID: ir.LeaseID, OK: true, FencingToken: ir.Lease.Fence,
			RemainingMS: rem, ExpiresAt: &at, RenewalCount: ir.Lease.RenewalCount}
	}
	return out, nil
}

// CreateSession creates a session and returns it with its secret token.
func (n *Node) CreateSession(ctx context.Context, r wire.SessionRequest) (*wire.Session, error) {
	if err := fsm.ValidHolder(r.Holder); err != nil {
		return nil, err
	}
	if err := n.cfg.checkTTL("ttl_ms", r.TTLMS); err != nil {
		return nil, err
	}
	if err := fsm.ValidMetadata(r.Metadata); err != nil {
		return nil, err
	}
	if err := n.disk.growthRefused(); err != nil {
		return nil, err
	}
	token := newToken()
	res, _, err := n.propose(ctx, &fsm.SessionCreate{SessionID: newID("ss_"), Holder: r.Holder,
		TokenHash: hashToken(token), TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, n.tk.period()),
		Metadata: r.Metadata, WallMS: wallNow().UnixMilli(), Quota: n.cfg.quota()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	v := n.rep.renderSession(res.Session)
	v.Token = token
	return v, nil
}

// SessionHeartbeat renews a session and so every lease bound to it. A
// heartbeat on an ended session fails with SESSION_ENDED (counted as late).
func (n *Node) SessionHeartbeat(ctx context.Context, id, token string) (*wire.Session, error) {
	return n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: id, Token: token})
}

// SessionHeartbeatWith is SessionHeartbeat with the request's options:
// Metadata, if not nil, replaces the session's metadata with the heartbeat
// (a worker's statistics; empty clears it), only if the heartbeat succeeds.
// Metadata past the limits of an acquire's is INVALID_ARGUMENT, field
// metadata; while a server of the cluster runs a version that cannot read
// such heartbeats, UNAVAILABLE (nothing changes).
func (n *Node) SessionHeartbeatWith(ctx context.Context, req wire.SessionHeartbeatRequest) (*wire.Session, error) {
	id, token := req.SessionID, req.Token
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	if token == "" {
		return nil, fsm.InvalidField("session_token", "the session token (X-Session-Token) is required")
	}
	cmd := &fsm.SessionHeartbeat{SessionID: id, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()}
	if req.Metadata != nil {
		if err := fsm.ValidMetadata(req.Metadata); err != nil {
			return nil, err
		}
		if err := n.serversRead("a session heartbeat with metadata", func(p cluster.Peer) bool { return p.SessionMeta }); err != nil {
			return nil, err
		}
		cmd.Metadata, cmd.SetMetadata = req.Metadata, true
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if res.Err.Code == wire.CodeSessionEnded {
			n.stats.lateHeartbeats.Add(1)
		}
		return nil, res.Err
	}
	return n.rep.renderSession(res.Session), nil
}

// EndSession ends a session; every lease bound to it is released with
// reason "session_ended". The session token is required unless force (an
// admin request) is set.
func (n *Node) EndSession(ctx context.Context, id, token string, force bool) (*wire.Session, error) {
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
	return n.rep.renderSession(res.Session), nil
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
func (c *Config) quota() fsm.Quota {
	return fsm.Quota{
		Leases: uint64(c.MaxLeases), HolderLeases: uint64(c.MaxLeasesPerHolder),
		Sessions: uint64(c.MaxSessions), HolderSessions: uint64(c.MaxSessionsPerHolder),
		KeyWaiters: uint64(c.MaxWaitersPerKey), HolderWaiters: uint64(c.MaxWaitersPerHolder),
	}
}
