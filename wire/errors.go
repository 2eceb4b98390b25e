package wire

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code. The codes are part of the
// external contract; HTTPStatus gives each its status.
type Code string

// The error codes. Codes produced by layers above the state machine (auth,
// transport, leadership, the control lease) live here too, so that each
// code has exactly one home.
const (
	CodeInvalidArgument     Code = "INVALID_ARGUMENT"
	CodeUnauthenticated     Code = "UNAUTHENTICATED"
	CodePermissionDenied    Code = "PERMISSION_DENIED"
	CodeLeaseTokenInvalid   Code = "LEASE_TOKEN_INVALID"
	CodeLeaseNotFound       Code = "LEASE_NOT_FOUND"
	CodeSessionNotFound     Code = "SESSION_NOT_FOUND"
	CodeLeaseHeld           Code = "LEASE_HELD"
	CodeLimitMismatch       Code = "LIMIT_MISMATCH"
	CodeLockDelay           Code = "LOCK_DELAY"
	CodeLeaseExpired        Code = "LEASE_EXPIRED"
	CodeLeaseReleased       Code = "LEASE_RELEASED"
	CodeLeaseRevoked        Code = "LEASE_REVOKED"
	CodeSessionEnded        Code = "SESSION_ENDED"
	CodeIdempotencyConflict Code = "IDEMPOTENCY_CONFLICT"
	CodePayloadTooLarge     Code = "PAYLOAD_TOO_LARGE"
	CodeResourceExhausted   Code = "RESOURCE_EXHAUSTED"
	CodeLeaseRequired       Code = "LEASE_REQUIRED"
	CodeControlLocked       Code = "CONTROL_LOCKED"
	CodeNoLeader            Code = "NO_LEADER"
	CodeIndeterminate       Code = "INDETERMINATE"
	CodeEventsCompacted     Code = "EVENTS_COMPACTED"
	CodeUnavailable         Code = "UNAVAILABLE"
	CodeNotFound            Code = "NOT_FOUND"
	CodeMethodNotAllowed    Code = "METHOD_NOT_ALLOWED"
	CodeInternal            Code = "INTERNAL"
	// CodeIndexPassed: a node's state hash was asked for at an index it
	// has applied past (GET /v1/cluster/local?hash_at=N).
	CodeIndexPassed Code = "INDEX_PASSED"
	// CodeOutOfService: this server took itself out of service (its state
	// differs from the cluster's, its log is damaged, the cluster removed
	// it, it is a frozen follower); Error.ServiceState names the state. The
	// request was not applied: send it to another server.
	CodeOutOfService Code = "OUT_OF_SERVICE"
	// CodeLeaseInvalid is the control lease's code (seed 000) for a wrong
	// control lease token or id.
	CodeLeaseInvalid Code = "LEASE_INVALID"
)

// HolderInfo names a current holder of a key in a LEASE_HELD error. It never
// carries a token.
type HolderInfo struct {
	Holder      string `json:"holder"`
	LeaseID     string `json:"lease_id"`
	RemainingMS int64  `json:"remaining_ms"`
}

// Error is a contract error: a code, a message and, where the code calls
// for them, details. From the state machine it is a business failure: the
// request was understood and refused, and it changed nothing. Field, Key,
// Holders, RemainingMS and Limit are set only where the code calls for them
// (RESOURCE_EXHAUSTED: Field names the limit reached, Limit is its value).
// It is also the "error" object of every error answer of the HTTP API.
type Error struct {
	Code        Code         `json:"code"`
	Message     string       `json:"message"`
	Field       string       `json:"field,omitempty"`
	Key         string       `json:"key,omitempty"`
	Holders     []HolderInfo `json:"holders,omitempty"`
	RemainingMS int64        `json:"remaining_ms,omitempty"`
	// AppliedIndex is the node's applied index, on INDEX_PASSED and on a
	// state hash that timed out.
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// Limit is the value of the limit a RESOURCE_EXHAUSTED names in Field.
	Limit uint64 `json:"limit,omitempty"`
	// ServiceState is the answering server's service state on
	// OUT_OF_SERVICE (diverged, damaged, removed, frozen).
	ServiceState string `json:"service_state,omitempty"`
	// Min and Max are the bounds of an INVALID_ARGUMENT for a value of
	// Field out of range (for a string, its length in bytes): set
	// together, by OutOfRange, so that a client need not parse Message.
	Min *int64 `json:"min,omitempty"`
	Max *int64 `json:"max,omitempty"`
}

// OutOfRange is the INVALID_ARGUMENT for a value of field outside
// [min, max]: "field must be min-max, got got", with the bounds as Min and
// Max. unit, if not empty, follows the bounds in the message ("bytes").
func OutOfRange(field string, min, max, got int64, unit string) *Error {
	msg := fmt.Sprintf("%s must be %d-%d, got %d", field, min, max, got)
	if unit != "" {
		msg = fmt.Sprintf("%s must be %d-%d %s, got %d", field, min, max, unit, got)
	}
	return &Error{Code: CodeInvalidArgument, Field: field, Message: msg, Min: &min, Max: &max}
}

// Bounds returns the bounds of an INVALID_ARGUMENT for a value out of
// range, and whether it carries them.
func (e *Error) Bounds() (min, max int64, ok bool) {
	if e == nil || e.Min == nil || e.Max == nil {
		return 0, 0, false
	}
	return *e.Min, *e.Max, true
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s (field %s)", e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Is lets errors.Is match on the code: errors.Is(err, &wire.Error{Code: c}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// ErrorCode returns the contract code of err, or "" when it carries none.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
