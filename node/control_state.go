package node

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// ControlKey is the reserved key of the global control lease.
const ControlKey = ReservedKeyPrefix + "control/global"

// ReservedKeyPrefix starts the keys the public lease API refuses.
const ReservedKeyPrefix = "_leasehold/"

// ControlScope is the only scope of the control lease in v1.
const ControlScope = "global"

// Control lease defaults and bounds (the control protocol's defaults).
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

func errControlOnly() *wire.Error {
	return fsm.InvalidField("lease_id", "control leases are granted, refreshed and released only over the control WebSocket")
}

// controlLease holds the control lease's helpers for one server (the
// operations themselves are Node's).
type controlLease struct {
	cfg *Config
	rep *replica
	tk  *ticker // the tick period and the Expire chunk
	// propose commits the control lease's entries.
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
}

// What the control lease looks like to the control protocol: its state,
// its refusals, and the events it turns into.

// ControlState is the control protocol's canonical lease state. LeaseToken is set only
// in the answer that granted (or refreshed) the lease to its owner; the
// *AtMs fields are the cluster clock (committed ticks times the tick
// period) modulo 2^32, the control protocol's wrap-tolerant millis(); RemainingMS is the
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
	// EndReason describe an ended lease. None of them is in the control protocol's
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

// ControlError is a refusal of a control operation with the control protocol's lock
// details. It unwraps to its *Error, so ErrorCode and errors.As work.
type ControlError struct {
	Err             *wire.Error
	OwnerClientName string
	RemainingMS     int64
}

func (e *ControlError) Error() string { return e.Err.Error() }

// Unwrap returns the contract error.
func (e *ControlError) Unwrap() error { return e.Err }

func controlLocked(owner string, remainingMS int64, msg string) *ControlError {
	return &ControlError{Err: &wire.Error{Code: wire.CodeControlLocked, Message: msg, RemainingMS: remainingMS},
		OwnerClientName: owner, RemainingMS: remainingMS}
}

func controlExpired(id string) *ControlError {
	return &ControlError{Err: &wire.Error{Code: wire.CodeLeaseExpired, Message: "control lease " + id + " timed out"}}
}

func controlInvalid(msg string) *ControlError {
	return &ControlError{Err: &wire.Error{Code: wire.CodeLeaseInvalid, Message: msg}}
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
		Active: state == fsm.StateActive.String(), LeaseID: id, Scope: ControlScope,
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

func (ctl *controlLease) controlView(l *fsm.Lease) *ControlState {
	ctl.rep.mu.RLock()
	defer ctl.rep.mu.RUnlock()
	return ctl.controlStateLocked(l)
}

// controlStateLocked renders a control lease record; the caller holds
// n.rep.mu.
func (ctl *controlLease) controlStateLocked(l *fsm.Lease) *ControlState {
	period := ctl.rep.period()
	tick := ctl.rep.f.Tick()
	rem := int64(0)
	if l.State == fsm.StateActive {
		rem = remaining(l.ExpiresTick, tick, period)
	}
	st := controlFromView(l.ID, l.Holder, l.State.String(), l.Metadata(), l.TTLMS, rem)
	st.AcquiredAtMS = clusterMS(l.AcquiredTick, period)
	st.ExpiresAtMS = clusterMS(l.ExpiresTick, period)
	if l.State != fsm.StateActive {
		st.EndedAtMS = clusterMS(l.EndedTick(), period)
		st.EndReason = l.EndReason()
	}
	return st
}

func (ctl *controlLease) inactiveControlLocked() *ControlState {
	return &ControlState{Scope: ControlScope, TTLMS: uint32(DefaultControlTTL.Milliseconds()),
		HeartbeatIntervalMS: uint32(DefaultControlHeartbeat.Milliseconds())}
}
