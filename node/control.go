package node

import (
	"context"
	"crypto/subtle"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The control lease (a WebSocket-owned global lock) is an ordinary exclusive lease on a reserved
// key, so it is replicated, expires by committed ticks and survives a leader
// change like any other lease. Its id is "cl_<hex>", its holder is the id of
// the WebSocket connection that owns it, its token is hashed in the state
// like every lease token, and the seed's owner fields travel in its
// metadata. The public lease API refuses the reserved key and control lease
// ids: only the control operations below grant, refresh or end it.

// ControlKey is the reserved key of the global control lease.
const ControlKey = ReservedKeyPrefix + "control/global"

// ReservedKeyPrefix starts the keys the public lease API refuses.
const ReservedKeyPrefix = "_leasehold/"

// ControlScope is the only scope of the control lease in v1.
const ControlScope = "global"

// Control lease defaults and bounds (the seed's defaults).
const (
	DefaultControlTTL       = 5000 * time.Millisecond
	DefaultControlHeartbeat = 1000 * time.Millisecond
	// MaxControlNameBytes bounds clientName and clientInstanceId.
	MaxControlNameBytes = 128
	// DefaultControlMaxTTL is the default of Config.ControlMaxTTL (and of
	// the WebSocket's bound, api.DefaultControlMaxTTL).
	DefaultControlMaxTTL = time.Minute
	// MinControlTTL is the shortest ttlMs a client may ask for.
	MinControlTTL = time.Second
	// MaxControlTokenBytes bounds the leaseToken of a control operation.
	MaxControlTokenBytes = 128
)

// ControlBreakReason starts the end reason of a control lease an admin
// broke (ControlBreak); the admin's name follows it.
const ControlBreakReason = "broken_by_admin:"

// CodeLeaseInvalid is the seed's code for a wrong control lease token or id
// (403). Only the control layer uses it.
const CodeLeaseInvalid = wire.CodeLeaseInvalid

// Metadata keys of a control lease record.
const (
	metaClientName = "client_name"
	metaInstanceID = "client_instance_id"
	metaWSClientID = "ws_client_id"
	metaHeartbeat  = "heartbeat_interval_ms"
	metaNode       = "node"
)

// IsControlLeaseID reports whether id names a control lease.
func IsControlLeaseID(id string) bool { return strings.HasPrefix(id, "cl_") }

func errControlOnly() *Error {
	return fsm.InvalidField("lease_id", "control leases are granted, refreshed and released only over the control WebSocket")
}

// ControlState is the seed's canonical lease state. LeaseToken is set only
// in the answer that granted (or refreshed) the lease to its owner; the
// *AtMs fields are the cluster clock (committed ticks times the tick
// period) modulo 2^32, the seed's wrap-tolerant millis(); RemainingMS is the
// authoritative countdown.
type ControlState struct {
	Active              bool   `json:"active"`
	LeaseID             string `json:"leaseId,omitempty"`
	LeaseToken          string `json:"leaseToken,omitempty"`
	Scope               string `json:"scope"`
	OwnerWSClientID     uint32 `json:"ownerWsClientId,omitempty"`
	OwnerClientName     string `json:"ownerClientName,omitempty"`
	OwnerInstanceID     string `json:"ownerInstanceId,omitempty"`
	AcquiredAtMS        uint32 `json:"acquiredAtMs"`
	ExpiresAtMS         uint32 `json:"expiresAtMs"`
	TTLMS               uint32 `json:"ttlMs"`
	HeartbeatIntervalMS uint32 `json:"heartbeatIntervalMs"`
	RemainingMS         uint32 `json:"remainingMs"`
	TakeoverAllowed     bool   `json:"takeoverAllowed"`
	// Owner is the holder (the owning connection's id); State, EndedAtMS and
	// EndReason describe an ended lease. None of them is in the seed's
	// objects; the API leaves them out of what it sends to clients.
	Owner     string `json:"-"`
	State     string `json:"-"`
	EndedAtMS uint32 `json:"-"`
	EndReason string `json:"-"`
}

// ControlAcquireRequest asks for the control lease on behalf of a
// connection. Holder identifies the connection cluster-wide. LeaseID and
// Token, when set, are the connection's current lease: a re-acquire by its
// owner refreshes that lease instead of failing.
type ControlAcquireRequest struct {
	Holder              string `json:"holder"`
	ClientName          string `json:"clientName,omitempty"`
	ClientInstanceID    string `json:"clientInstanceId,omitempty"`
	WSClientID          uint32 `json:"wsClientId"`
	TTLMS               int64  `json:"ttlMs,omitempty"`
	HeartbeatIntervalMS int64  `json:"heartbeatIntervalMs,omitempty"`
	LeaseID             string `json:"leaseId,omitempty"`
	Token               string `json:"leaseToken,omitempty"`
}

// ControlError is a refusal of a control operation with the seed's lock
// details. It unwraps to its *Error, so ErrorCode and errors.As work.
type ControlError struct {
	Err             *Error
	OwnerClientName string
	RemainingMS     int64
}

func (e *ControlError) Error() string { return e.Err.Error() }

// Unwrap returns the contract error.
func (e *ControlError) Unwrap() error { return e.Err }

func controlLocked(owner string, remainingMS int64, msg string) *ControlError {
	return &ControlError{Err: &Error{Code: CodeControlLocked, Message: msg, RemainingMS: remainingMS},
		OwnerClientName: owner, RemainingMS: remainingMS}
}

func controlExpired(id string) *ControlError {
	return &ControlError{Err: &Error{Code: CodeLeaseExpired, Message: "control lease " + id + " timed out"}}
}

func controlInvalid(msg string) *ControlError {
	return &ControlError{Err: &Error{Code: CodeLeaseInvalid, Message: msg}}
}

func (n *Node) validateControlAcquire(r *ControlAcquireRequest) *Error {
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
	if most := n.controlMaxTTL().Milliseconds(); r.TTLMS < MinControlTTL.Milliseconds() || r.TTLMS > most {
		return fsm.InvalidField("ttlMs", "ttlMs must be %d-%d, got %d", MinControlTTL.Milliseconds(), most, r.TTLMS)
	}
	if err := n.checkTTL("ttlMs", r.TTLMS); err != nil {
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
func (n *Node) controlMaxTTL() time.Duration {
	most := n.cfg.ControlMaxTTL
	if most <= 0 {
		most = DefaultControlMaxTTL
	}
	return min(most, n.cfg.MaxTTL)
}

func validControlName(field, s string) *Error {
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
	if err := n.validateControlAcquire(&r); err != nil {
		return nil, err
	}
	if r.LeaseID != "" && r.Token != "" {
		st, err := n.ControlHeartbeat(ctx, r.Holder, r.LeaseID, r.Token)
		if c := ErrorCode(err); c == CodeLeaseExpired || c == CodeLeaseInvalid {
			// The owner's lease ran out or ended: a re-acquire grants a new
			// one. A lease whose countdown reached zero may still be active
			// until its expiry commits (within two ticks): end it first, so
			// that its owner is not told its own lease locks it out.
			if c == CodeLeaseExpired && n.lookupActive(r.LeaseID) != nil {
				if _, _, err := n.propose(ctx, &fsm.Release{LeaseID: r.LeaseID, TokenHash: hashToken(r.Token),
					Reason: ReasonTimedOut, WallMS: wallNow().UnixMilli()}); err != nil {
					return nil, err
				}
			}
			return n.controlGrant(ctx, r)
		}
		if err == nil {
			st.LeaseToken = r.Token
		}
		return st, err
	}
	return n.controlGrant(ctx, r)
}

func (n *Node) controlGrant(ctx context.Context, r ControlAcquireRequest) (*ControlState, error) {
	period := n.period()
	token := newToken()
	cmd := &fsm.Acquire{
		LeaseID: newID("cl_"), Key: ControlKey, Holder: r.Holder, Limit: 1, TokenHash: hashToken(token),
		TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, period), WallMS: wallNow().UnixMilli(),
		Metadata: map[string]string{
			metaWSClientID: strconv.FormatUint(uint64(r.WSClientID), 10),
			metaHeartbeat:  strconv.FormatInt(r.HeartbeatIntervalMS, 10),
			metaNode:       n.cfg.NodeID,
		},
	}
	if r.ClientName != "" {
		cmd.Metadata[metaClientName] = r.ClientName
	}
	if r.ClientInstanceID != "" {
		cmd.Metadata[metaInstanceID] = r.ClientInstanceID
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if res.Err.Code == CodeLeaseHeld || res.Err.Code == CodeLockDelay {
			return nil, n.lockedError("Control lease is held by another client")
		}
		return nil, res.Err
	}
	st := n.controlView(res.Lease)
	st.LeaseToken = token
	return st, nil
}

// lockedError describes the current owner from this node's state.
func (n *Node) lockedError(msg string) *ControlError {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	for _, l := range n.rep.f.ActiveOnKey(ControlKey) {
		st := n.controlStateLocked(l)
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
	if err := n.controlPrecheck(holder, leaseID, token); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.Renew{LeaseID: leaseID, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, n.controlRefusal(leaseID, res.Err)
	}
	return n.controlView(res.Lease), nil
}

// ControlRelease ends the control lease leaseID of the connection holder
// (reason is the owner's, "owner_disconnected" when its connection closed).
// Errors as ControlHeartbeat.
func (n *Node) ControlRelease(ctx context.Context, holder, leaseID, token, reason string) (*ControlState, error) {
	if err := n.controlPrecheck(holder, leaseID, token); err != nil {
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
		return nil, n.controlRefusal(leaseID, res.Err)
	}
	return n.controlView(res.Lease), nil
}

// controlPrecheck refuses, from this node's state, what the state machine
// would accept but the seed does not: a lease whose countdown reached zero,
// or one owned by another connection.
func (n *Node) controlPrecheck(holder, leaseID, token string) error {
	if err := checkControlCreds(leaseID, token); err != nil {
		return err
	}
	if err := fsm.ValidHolder(holder); err != nil {
		return err
	}
	if err := n.ControlCheck(leaseID, token); err != nil {
		return err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	if l := n.rep.f.Lease(leaseID); l != nil && l.State == fsm.StateActive && l.Holder != holder {
		st := n.controlStateLocked(l)
		return controlLocked(st.OwnerClientName, int64(st.RemainingMS), "the control lease belongs to another connection")
	}
	return nil
}

// checkControlCreds: a lease id that is not a control lease's is
// LEASE_INVALID (a *ControlError, as every refusal of the seed's codes);
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
	if by == "" {
		by = "anonymous"
	}
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
		return nil, fsm.Errorf(CodeLeaseNotFound, "no control lease is active")
	}
	res, _, err := n.propose(ctx, &fsm.Revoke{LeaseID: id, Reason: reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.controlView(res.Lease), nil
}

// controlRefusal turns the state machine's refusal of a renew or release
// of a control lease into the seed's codes.
func (n *Node) controlRefusal(leaseID string, e *Error) error {
	switch e.Code {
	case CodeLeaseNotFound, CodeLeaseTokenInvalid:
		return controlInvalid("leaseId or leaseToken does not match the control lease")
	case CodeLeaseExpired:
		return controlExpired(leaseID)
	case CodeLeaseReleased, CodeLeaseRevoked:
		if le := n.lockedError("Control lease is held by another client"); le.OwnerClientName != "" || le.RemainingMS > 0 {
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
		return n.controlStateLocked(l), nil
	}
	return n.inactiveControlLocked(), nil
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
func (n *Node) ControlCheck(leaseID, token string) error {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	f := n.rep.f
	active := f.ActiveOnKey(ControlKey)
	if len(active) == 0 {
		return nil
	}
	cur := active[0]
	st := n.controlStateLocked(cur)
	locked := func() error {
		return controlLocked(st.OwnerClientName, int64(st.RemainingMS), "Control lease is held by another client")
	}
	if token == "" {
		e := controlLocked(st.OwnerClientName, int64(st.RemainingMS), "the control lease is active: send its token in X-Control-Lease")
		e.Err.Code = CodeLeaseRequired
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

// ControlEvent turns an event of the control lease into the seed's
// control.stateChanged: the event name (acquired, heartbeat, released,
// expired, revoked or ownerDisconnected) and the state after it. ok is
// false for events of other keys.
func (n *Node) ControlEvent(ev Event) (name string, st *ControlState, ok bool) {
	if ev.Lease == nil || ev.Lease.Key != ControlKey {
		return "", nil, false
	}
	n.rep.mu.RLock()
	period := n.rep.period()
	var acquiredTick, endedTick uint64
	if l := n.rep.f.Lease(ev.Lease.LeaseID); l != nil {
		acquiredTick, endedTick = l.AcquiredTick, l.EndedTick
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

// ReasonOwnerDisconnected is the release reason when the owning connection
// closed.
const ReasonOwnerDisconnected = "owner_disconnected"

// ReasonTimedOut ends a control lease whose countdown reached zero before
// its expiry committed, when its owner acquires again; it is reported as
// an expiry.
const ReasonTimedOut = "expired"

// clusterMS is the cluster clock at tick, modulo 2^32 (wrap-tolerant).
func clusterMS(tick uint64, period int64) uint32 { return uint32(tick * uint64(period)) }

func controlFromView(id, holder, state string, meta map[string]string, ttlMS, remainingMS int64) *ControlState {
	st := &ControlState{
		Active: state == string(fsm.StateActive), LeaseID: id, Scope: ControlScope,
		OwnerClientName: meta[metaClientName], OwnerInstanceID: meta[metaInstanceID],
		TTLMS: uint32(ttlMS), RemainingMS: uint32(max(0, remainingMS)), Owner: holder, State: state,
	}
	if v, err := strconv.ParseUint(meta[metaWSClientID], 10, 32); err == nil {
		st.OwnerWSClientID = uint32(v)
	}
	if v, err := strconv.ParseUint(meta[metaHeartbeat], 10, 32); err == nil {
		st.HeartbeatIntervalMS = uint32(v)
	}
	if !st.Active {
		st.RemainingMS = 0
	}
	return st
}

func (n *Node) controlView(l *fsm.Lease) *ControlState {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.controlStateLocked(l)
}

// controlStateLocked renders a control lease record; the caller holds
// n.rep.mu.
func (n *Node) controlStateLocked(l *fsm.Lease) *ControlState {
	period := n.rep.period()
	tick := n.rep.f.Tick()
	rem := int64(0)
	if l.State == fsm.StateActive {
		rem = remaining(l.ExpiresTick, tick, period)
	}
	st := controlFromView(l.ID, l.Holder, string(l.State), l.Metadata, l.TTLMS, rem)
	st.AcquiredAtMS = clusterMS(l.AcquiredTick, period)
	st.ExpiresAtMS = clusterMS(l.ExpiresTick, period)
	if l.State != fsm.StateActive {
		st.EndedAtMS = clusterMS(l.EndedTick, period)
		st.EndReason = l.EndReason
	}
	return st
}

func (n *Node) inactiveControlLocked() *ControlState {
	return &ControlState{Scope: ControlScope, TTLMS: uint32(DefaultControlTTL.Milliseconds()),
		HeartbeatIntervalMS: uint32(DefaultControlHeartbeat.Milliseconds())}
}

// ControlClock is the cluster clock in milliseconds modulo 2^32 (committed
// ticks times the tick period), as this node has applied it.
func (n *Node) ControlClock() uint32 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return clusterMS(n.rep.f.Tick(), n.rep.period())
}
