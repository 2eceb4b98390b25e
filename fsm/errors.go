package fsm

import (
	"fmt"

	"github.com/leasehold/leasehold/wire"
)

// Errorf builds an *Error with a formatted message.
func Errorf(code wire.Code, format string, args ...any) *wire.Error {
	return &wire.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// InvalidField builds an INVALID_ARGUMENT error naming the offending field.
func InvalidField(field, format string, args ...any) *wire.Error {
	return &wire.Error{Code: wire.CodeInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Exhausted builds a RESOURCE_EXHAUSTED error: the limit named field, of
// value limit, is reached.
func Exhausted(field string, limit uint64, format string, args ...any) *wire.Error {
	return &wire.Error{Code: wire.CodeResourceExhausted, Field: field, Limit: limit, Message: fmt.Sprintf(format, args...)}
}
