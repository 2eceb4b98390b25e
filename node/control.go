package node

import (
	"cmp"
	"context"
	"crypto/subtle"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The control lease (a WebSocket-owned global lock) is an ordinary
// exclusive lease on a reserved key, so it is replicated, expires by
// committed ticks and survives a leader change like any other lease. Its id
// is "cl_<hex>", its holder is the id of the WebSocket connection that owns
// it, its token is hashed like every lease token, and the control
// protocol's owner fields travel in its metadata. The public lease API refuses the reserved key and control lease
// ids: only the control operations below grant, refresh or end it.

func (ctl *controlLease) validateControlAcquire(r *ControlAcquireRequest) *wire.Error {
	if err := fsm.ValidHolder(r.Holder); err != nil {
		return err
	}
	if err := validControlName("clientName", r.ClientName); err != nil {
		return err
	}
	if err := validControlName("clientInstanceId", r.ClientInstanceID); err != nil {
		return err
	}
	if r.TTLMS == 0 {
		r.TTLMS = DefaultControlTTL.Milliseconds()
	}
	// The WebSocket's bounds again, where the lease is granted: a request
	// that reached the leader by another way cannot exceed them.
	if most := ctl.controlMaxTTL().Milliseconds(); r.TTLMS < MinControlTTL.Milliseconds() || r.TTLMS > most {
		return wire.OutOfRange("ttlMs", MinControlTTL.Milliseconds(), most, r.TTLMS, "")
	}
	if err := ctl.cfg.checkTTL("ttlMs", r.TTLMS); err != nil {
		return err
	}
	if r.TTLMS > int64(^uint32(0)) {
		return fsm.InvalidField("ttlMs", "ttlMs must fit in 32 bits")
	}
	if r.LeaseID != "" && (len(r.LeaseID) > fsm.MaxIDBytes || !IsControlLeaseID(r.LeaseID)) {
		return fsm.InvalidField("leaseId", "leaseId must name a control lease (at most %d bytes)", fsm.MaxIDBytes)
	}
	if len(r.Token) > MaxControlTokenBytes {
		return fsm.InvalidField("leaseToken", "leaseToken must be at most %d bytes", MaxControlTokenBytes)
	}
	if r.HeartbeatIntervalMS == 0 {
		r.HeartbeatIntervalMS = min(DefaultControlHeartbeat.Milliseconds(), r.TTLMS/3)
	}
	if r.HeartbeatIntervalMS < 1 || r.HeartbeatIntervalMS > r.TTLMS/2 {
		return fsm.InvalidField("heartbeatIntervalMs", "heartbeatIntervalMs must be 1-%d (half the TTL), got %d", r.TTLMS/2, r.HeartbeatIntervalMS)
	}
	return nil
}

// controlMaxTTL is the longest TTL the control lease is granted for.
func (ctl *controlLease) controlMaxTTL() time.Duration {
	most := ctl.cfg.ControlMaxTTL
	if most <= 0 {
		most = DefaultControlMaxTTL
	}
	return min(most, ctl.cfg.MaxTTL)
}

func validControlName(field, s string) *wire.Error {
	if s == "" {
		return nil
	}
	if len(s) > MaxControlNameBytes {
		return fsm.InvalidField(field, "%s must be at most %d bytes, got %d", field, MaxControlNameBytes, len(s))
	}
	if err := fsm.ValidHolder(s); err != nil {
		err.Field = field
		err.Message = strings.Replace(err.Message, "holder", field, 1)
		return err
	}
	return nil
}

// ControlAcquire grants the control lease to the connection r.Holder, or,
// when that connection already owns it (r.LeaseID and r.Token), refreshes
// it for another TTL. The answer carries the token. Another owner's active
// lease is CONTROL_LOCKED (a *ControlError with its owner and countdown).
// Writes need the leader: a follower answers NO_LEADER.
func (n *Node) ControlAcquire(ctx context.Context, r ControlAcquireRequest) (*ControlState, error) {
	if err := n.ctl.validateControlAcquire(&r); err != nil {
		return nil, err
	}
	if r.LeaseID != "" && r.Token != "" {
		st, err := n.ControlHeartbeat(ctx, r.Holder, r.LeaseID, r.Token)
		if c := wire.ErrorCode(err); c == wire.CodeLeaseExpired || c == wire.CodeLeaseInvalid {
			// The owner's lease ran out or ended: a re-acquire grants a new
			// one. A lease whose countdown reached zero may still be active
			// until its expiry commits: end it first, so that its owner is
			// not told its own lease locks it out.
			if c == wire.CodeLeaseExpired && n.rep.lookupActive(r.LeaseID) != nil {
				if err := n.ctl.endOwnControlLease(ctx, r.LeaseID, r.Token); err != nil {
					return nil, err
				}
			}
			return n.ctl.controlGrant(ctx, r)
		}
		if err == nil {
			st.LeaseToken = r.Token
		}
		return st, err
	}
	return n.ctl.controlGrant(ctx, r)
}

// endOwnControlLease ends the control lease id of a re-acquiring owner
// (token is its own) whose countdown reached zero but which is still
// active. Before its deadline a release ends it (reported as an expiry).
// Past it, the lease is due: the state machine refuses the release
// (LEASE_EXPIRED) and the lease holds the key until its expiry chunk
// applies, so the expiry chunks of the current tick, due anyway, are
// proposed here until it has ended.
func (ctl *controlLease) endOwnControlLease(ctx context.Context, id, token string) error {
	res, _, err := ctl.propose(ctx, &fsm.Release{LeaseID: id, TokenHash: hashToken(token),
		Reason: ReasonTimedOut, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return err
	}
	if res.Err == nil {
		return nil
	}
	switch res.Err.Code {
	case wire.CodeLeaseReleased, wire.CodeLeaseRevoked:
		return nil // ended meanwhile
	case wire.CodeLeaseExpired: // ended meanwhile, or due
	default:
		return ctl.controlRefusal(id, res.Err)
	}
	for tries, most := 0, -1; ; tries++ {
		ctl.rep.mu.RLock()
		l := ctl.rep.f.Lease(id)
		active := l != nil && l.State == fsm.StateActive
		tick, backlog := ctl.rep.f.Tick(), ctl.rep.f.Backlog()
		ctl.rep.mu.RUnlock()
		if most < 0 {
			// Every chunk ends up to chunk() records, the lease among
			// them in its turn; a few more for ticks applied meanwhile.
			most = backlog/int(ctl.tk.chunk()) + 4
		}
		if !active || backlog == 0 || !ctl.tk.chunkedOK.Load() || tries >= most {
			// Ended, or not due after all: the grant answers.
			return nil
		}
		if _, _, err := ctl.propose(ctx, &fsm.Expire{Tick: tick, WallMS: wallNow().UnixMilli(), Max: ctl.tk.chunk()}); err != nil {
			return err
		}
	}
}

func (ctl *controlLease) controlGrant(ctx context.Context, r ControlAcquireRequest) (*ControlState, error) {
	period := ctl.tk.period()
	token := newToken()
	cmd := &fsm.Acquire{
		LeaseID: newID("cl_"), Key: ControlKey, Holder: r.Holder, Limit: 1, TokenHash: hashToken(token),
		TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, period), WallMS: wallNow().UnixMilli(),
		Metadata: map[string]string{
			metaWSClientID: strconv.FormatUint(uint64(r.WSClientID), 10),
			metaHeartbeat:  strconv.FormatInt(r.HeartbeatIntervalMS, 10),
			metaNode:       ctl.cfg.NodeID,
		},
	}
	if r.ClientName != "" {
		cmd.Metadata[metaClientName] = r.ClientName
	}
	if r.ClientInstanceID != "" {
		cmd.Metadata[metaInstanceID] = r.ClientInstanceID
	}
	res, _, err := ctl.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if res.Err.Code == wire.CodeLeaseHeld || res.Err.Code == wire.CodeLockDelay {
			return nil, ctl.lockedError("Control lease is held by another client")
		}
		return nil, res.Err
	}
	st := ctl.controlView(res.Lease)
	st.LeaseToken = token
	return st, nil
}

// lockedError describes the current owner from this node's state.
func (ctl *controlLease) lockedError(msg string) *ControlError {
	ctl.rep.mu.RLock()
	defer ctl.rep.mu.RUnlock()
	for _, l := range ctl.rep.f.ActiveOnKey(ControlKey) {
		st := ctl.controlStateLocked(l)
		return controlLocked(st.OwnerClientName, int64(st.RemainingMS), msg)
	}
	return controlLocked("", 0, msg)
}

// ControlHeartbeat refreshes the control lease leaseID of the connection
// holder for another TTL. Errors: LEASE_INVALID for an unknown id or a
// wrong token, LEASE_EXPIRED when its countdown reached zero,
// CONTROL_LOCKED when another connection holds the lease now (or owns
// this one: the lease belongs to the connection that acquired it).
func (n *Node) ControlHeartbeat(ctx context.Context, holder, leaseID, token string) (*ControlState, error) {
	if err := n.ctl.controlPrecheck(holder, leaseID, token); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.Renew{LeaseID: leaseID, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, n.ctl.controlRefusal(leaseID, res.Err)
	}
	return n.ctl.controlView(res.Lease), nil
}

// ControlRelease ends the control lease leaseID of the connection holder
// (reason is the owner's, "owner_disconnected" when its connection closed).
// Errors as ControlHeartbeat.
func (n *Node) ControlRelease(ctx context.Context, holder, leaseID, token, reason string) (*ControlState, error) {
	if err := n.ctl.controlPrecheck(holder, leaseID, token); err != nil {
		return nil, err
	}
	if err := fsm.ValidReason(reason); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.Release{LeaseID: leaseID, TokenHash: hashToken(token), Reason: reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, n.ctl.controlRefusal(leaseID, res.Err)
	}
	return n.ctl.controlView(res.Lease), nil
}

// controlPrecheck refuses, from this node's state, what the state machine
// would accept but the control protocol does not: a lease whose countdown reached zero,
// or one owned by another connection.
func (ctl *controlLease) controlPrecheck(holder, leaseID, token string) error {
	if err := checkControlCreds(leaseID, token); err != nil {
		return err
	}
	if err := fsm.ValidHolder(holder); err != nil {
		return err
	}
	if err := ctl.check(leaseID, token); err != nil {
		return err
	}
	ctl.rep.mu.RLock()
	defer ctl.rep.mu.RUnlock()
	if l := ctl.rep.f.Lease(leaseID); l != nil && l.State == fsm.StateActive && l.Holder != holder {
		st := ctl.controlStateLocked(l)
		return controlLocked(st.OwnerClientName, int64(st.RemainingMS), "the control lease belongs to another connection")
	}
	return nil
}

// checkControlCreds: a lease id that is not a control lease's is
// LEASE_INVALID (a *ControlError, as every refusal of the control protocol's codes);
// a missing or oversized token INVALID_ARGUMENT.
func checkControlCreds(leaseID, token string) error {
	if leaseID == "" || len(leaseID) > fsm.MaxIDBytes || !IsControlLeaseID(leaseID) {
		return controlInvalid("leaseId " + strconv.Quote(truncateID(leaseID)) + " is not a control lease")
	}
	if token == "" || len(token) > MaxControlTokenBytes {
		return fsm.InvalidField("leaseToken", "leaseToken is required (1-%d bytes)", MaxControlTokenBytes)
	}
	return nil
}

func truncateID(id string) string {
	if len(id) > fsm.MaxIDBytes {
		return id[:fsm.MaxIDBytes] + "..."
	}
	return id
}

// ControlBreak ends the active control lease by operator force: the way
// out when its owner is stuck (a socket that stays open without acting).
// by names who broke it (an admin token's name, never a secret; "" is
// "anonymous"): the lease ends revoked with the reason ControlBreakReason
// followed by by, which its revoked event carries. It needs no control
// lease token. With no active control lease the answer is
// LEASE_NOT_FOUND. Writes need the leader: a follower answers NO_LEADER.
func (n *Node) ControlBreak(ctx context.Context, by string) (*ControlState, error) {
	by = cmp.Or(by, "anonymous")
	if fsm.ValidHolder(by) != nil { // control characters, invalid UTF-8
		by = strconv.Quote(by)
	}
	reason := ControlBreakReason + by
	if len(reason) > fsm.MaxReasonBytes {
		reason = strings.ToValidUTF8(reason[:fsm.MaxReasonBytes], "")
	}
	if err := n.readBarrier(ctx, false); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	var id string
	for _, l := range n.rep.f.ActiveOnKey(ControlKey) {
		id = l.ID
	}
	n.rep.mu.RUnlock()
	if id == "" {
		return nil, fsm.Errorf(wire.CodeLeaseNotFound, "no control lease is active")
	}
	res, _, err := n.propose(ctx, &fsm.Revoke{LeaseID: id, Reason: reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.ctl.controlView(res.Lease), nil
}

// controlRefusal turns the state machine's refusal of a renew or release
// of a control lease into the control protocol's codes.
func (ctl *controlLease) controlRefusal(leaseID string, e *wire.Error) error {
	switch e.Code {
	case wire.CodeLeaseNotFound, wire.CodeLeaseTokenInvalid:
		return controlInvalid("leaseId or leaseToken does not match the control lease")
	case wire.CodeLeaseExpired:
		return controlExpired(leaseID)
	case wire.CodeLeaseReleased, wire.CodeLeaseRevoked:
		if le := ctl.lockedError("Control lease is held by another client"); le.OwnerClientName != "" || le.RemainingMS > 0 {
			return le
		}
		return controlInvalid("control lease " + leaseID + " has ended")
	}
	return e
}

// ControlStatus returns the control lease's state (Active false when nobody
// holds it), never with its token. Linearizable unless stale.
func (n *Node) ControlStatus(ctx context.Context, stale bool) (*ControlState, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	for _, l := range n.rep.f.ActiveOnKey(ControlKey) {
		return n.ctl.controlStateLocked(l), nil
	}
	return n.ctl.inactiveControlLocked(), nil
}

// ControlCheck is the gate of routes the control lease protects, against
// this node's applied state (the leader's is current; a follower's may lag
// by the replication delay). It returns nil when no control lease is active
// or token is the active lease's (compared in constant time, as hashes).
// Otherwise: LEASE_REQUIRED when token is empty; LEASE_EXPIRED when the
// token is that of a control lease whose countdown reached zero; LEASE_INVALID
// when token does not match the lease leaseID names (or, with no leaseID,
// any control lease); CONTROL_LOCKED when it is another, ended lease's
// token or leaseID names another lease. leaseID (X-Control-Lease-Id) is
// optional.
func (n *Node) ControlCheck(leaseID, token string) error { return n.ctl.check(leaseID, token) }

func (ctl *controlLease) check(leaseID, token string) error {
	ctl.rep.mu.RLock()
	defer ctl.rep.mu.RUnlock()
	f := ctl.rep.f
	active := f.ActiveOnKey(ControlKey)
	if len(active) == 0 {
		return nil
	}
	cur := active[0]
	st := ctl.controlStateLocked(cur)
	locked := func() error {
		return controlLocked(st.OwnerClientName, int64(st.RemainingMS), "Control lease is held by another client")
	}
	if token == "" {
		e := controlLocked(st.OwnerClientName, int64(st.RemainingMS), "the control lease is active: send its token in X-Control-Lease")
		e.Err.Code = wire.CodeLeaseRequired
		return e
	}
	h := hashToken(token)
	if subtle.ConstantTimeCompare(h[:], cur.TokenHash[:]) == 1 {
		if st.RemainingMS == 0 {
			return controlExpired(cur.ID)
		}
		return nil
	}
	if leaseID == "" || leaseID == cur.ID {
		return controlInvalid("X-Control-Lease is not the active control lease's token")
	}
	// leaseID names another lease: an earlier one of this client, or junk.
	old := f.Lease(leaseID)
	if old == nil || old.Key != ControlKey {
		return controlInvalid("X-Control-Lease-Id names no control lease")
	}
	if subtle.ConstantTimeCompare(h[:], old.TokenHash[:]) != 1 {
		return controlInvalid("X-Control-Lease does not match control lease " + leaseID)
	}
	if old.State == fsm.StateExpired {
		return controlExpired(leaseID)
	}
	return locked()
}

// ControlEvent turns an event of the control lease into the control protocol's
// control.stateChanged: the event name (acquired, heartbeat, released,
// expired, revoked or ownerDisconnected) and the state after it. ok is
// false for events of other keys.
func (n *Node) ControlEvent(ev wire.Event) (name string, st *ControlState, ok bool) {
	if ev.Lease == nil || ev.Lease.Key != ControlKey {
		return "", nil, false
	}
	n.rep.mu.RLock()
	period := n.rep.period()
	var acquiredTick, endedTick uint64
	if l := n.rep.f.Lease(ev.Lease.LeaseID); l != nil {
		acquiredTick, endedTick = l.AcquiredTick, l.EndedTick()
	}
	n.rep.mu.RUnlock()
	v := ev.Lease
	st = controlFromView(v.LeaseID, v.Holder, v.State, v.Metadata, v.TTLMS, v.RemainingMS)
	st.AcquiredAtMS = clusterMS(acquiredTick, period)
	st.EndReason = v.EndReason
	switch ev.Type {
	case "acquired":
		name = "acquired"
	case "renewed":
		name = "heartbeat"
	case "released":
		name = "released"
		switch v.EndReason {
		case ReasonOwnerDisconnected:
			name = "ownerDisconnected"
		case ReasonTimedOut:
			name = "expired"
		}
	case "expired":
		name = "expired"
	case "revoked":
		name = "revoked"
	default:
		name = ev.Type
	}
	if st.Active {
		st.ExpiresAtMS = clusterMS(ev.Tick, period) + uint32(v.RemainingMS)
	} else {
		st.EndedAtMS = clusterMS(endedTick, period)
		st.ExpiresAtMS = st.EndedAtMS
	}
	return name, st, true
}

// ControlClock is the cluster clock in milliseconds modulo 2^32 (committed
// ticks times the tick period), as this node has applied it.
func (n *Node) ControlClock() uint32 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return clusterMS(n.rep.f.Tick(), n.rep.period())
}
