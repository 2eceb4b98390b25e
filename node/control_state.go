package node

import (
	"strconv"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

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

// ControlClock is the cluster clock in milliseconds modulo 2^32 (committed
// ticks times the tick period), as this node has applied it.
func (n *Node) ControlClock() uint32 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return clusterMS(n.rep.f.Tick(), n.rep.period())
}
