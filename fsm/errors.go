package fsm

import (
	"fmt"

	"github.com/leasehold/leasehold/wire"
)

// Code is a contract error code. The codes, the Error type and HolderInfo
// are defined in package wire, their one home, and named here so that the
// state machine's code reads as before.
type Code = wire.Code

// The error codes the state machine and the layers above it produce.
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
	CodeUnavailable         = wire.CodeUnavailable
	CodeNotFound            = wire.CodeNotFound
	CodeMethodNotAllowed    = wire.CodeMethodNotAllowed
	CodeInternal            = wire.CodeInternal
	CodeIndexPassed         = wire.CodeIndexPassed
)

// HolderInfo names a current holder of a key in a LEASE_HELD error. It never
// carries a token.
type HolderInfo = wire.HolderInfo

// Error is a business failure: the request was understood and refused, and
// it changed nothing. Compare codes with errors.Is(err, &fsm.Error{Code: c}).
type Error = wire.Error

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// InvalidField builds an INVALID_ARGUMENT error naming the offending field.
func InvalidField(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Exhausted builds a RESOURCE_EXHAUSTED error: the limit named field, of
// value limit, is reached.
func Exhausted(field string, limit uint64, format string, args ...any) *Error {
	return &Error{Code: CodeResourceExhausted, Field: field, Limit: limit, Message: fmt.Sprintf(format, args...)}
}
