package node

import (
	"github.com/leasehold/leasehold/wire"
)

// Error is the error type of every operation: a contract error code with a
// message and, where the code calls for them, details. Compare codes with
// errors.As, or errors.Is(err, &node.Error{Code: node.CodeLeaseHeld}).
type Error = wire.Error

// Code is a contract error code.
type Code = wire.Code

// HolderInfo names a current holder in a LEASE_HELD error.
type HolderInfo = wire.HolderInfo

// The contract's error codes, re-exported for callers of the embedded API.
const (
	CodeInvalidArgument     = wire.CodeInvalidArgument
	CodeUnauthenticated     = wire.CodeUnauthenticated
	CodePermissionDenied    = wire.CodePermissionDenied
	CodeLeaseTokenInvalid   = wire.CodeLeaseTokenInvalid
	CodeLeaseNotFound       = wire.CodeLeaseNotFound
	CodeSessionNotFound     = wire.CodeSessionNotFound
	CodeLeaseHeld           = wire.CodeLeaseHeld
	CodeLimitMismatch       = wire.CodeLimitMismatch
	CodeLockDelay           = wire.CodeLockDelay
	CodeLeaseExpired        = wire.CodeLeaseExpired
	CodeLeaseReleased       = wire.CodeLeaseReleased
	CodeLeaseRevoked        = wire.CodeLeaseRevoked
	CodeSessionEnded        = wire.CodeSessionEnded
	CodeIdempotencyConflict = wire.CodeIdempotencyConflict
	CodePayloadTooLarge     = wire.CodePayloadTooLarge
	CodeResourceExhausted   = wire.CodeResourceExhausted
	CodeLeaseRequired       = wire.CodeLeaseRequired
	CodeControlLocked       = wire.CodeControlLocked
	CodeNoLeader            = wire.CodeNoLeader
	CodeIndeterminate       = wire.CodeIndeterminate
	CodeEventsCompacted     = wire.CodeEventsCompacted
	CodeNotFound            = wire.CodeNotFound
	CodeMethodNotAllowed    = wire.CodeMethodNotAllowed
	CodeUnavailable         = wire.CodeUnavailable
	CodeInternal            = wire.CodeInternal
)

// The request and response types of the contract; see package wire.
type (
	Lease           = wire.Lease
	Session         = wire.Session
	AcquireRequest  = wire.AcquireRequest
	ReleaseRequest  = wire.ReleaseRequest
	HeartbeatItem   = wire.HeartbeatItem
	HeartbeatResult = wire.HeartbeatResult
	SessionRequest  = wire.SessionRequest
	ListRequest     = wire.ListRequest
	LeaseList       = wire.LeaseList
	SessionList     = wire.SessionList
	ValidateRequest = wire.ValidateRequest
	ValidateResult  = wire.ValidateResult
	Event           = wire.Event
	EventFilter     = wire.EventFilter
	Member          = wire.Member
	ClusterStatus   = wire.ClusterStatus
)

// Stats are counters for /metrics. Totals count since the process started.
type Stats struct {
	ActiveLeases      int
	ActiveSessions    int
	Acquired          uint64
	Renewed           uint64
	Released          uint64
	Expired           uint64
	Revoked           uint64
	SessionsCreated   uint64
	SessionHeartbeats uint64
	LateHeartbeats    uint64
	SessionsExpired   uint64
	CommitIndex       uint64
	AppliedIndex      uint64
	Tick              uint64
	IsLeader          bool
	// ApplyLatency is a histogram of proposal-to-apply latency in seconds:
	// cumulative counts per upper bound in ApplyBuckets, plus sum and count.
	ApplyBuckets []float64
	ApplyCounts  []uint64
	ApplySum     float64
	ApplyCount   uint64
	EventStreams int
}

// ErrorCode returns the contract code of err, or "" when it carries none.
func ErrorCode(err error) Code { return wire.ErrorCode(err) }
