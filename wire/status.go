package wire

import "sort"

// statuses is the one table from error code to HTTP status. The statuses
// are written as numbers so that this package, which the state machine
// imports for its codes, does not link net/http.
var statuses = map[Code]int{
	CodeInvalidArgument:     400,
	CodeUnauthenticated:     401,
	CodePermissionDenied:    403,
	CodeLeaseTokenInvalid:   403,
	CodeLeaseInvalid:        403,
	CodeLeaseNotFound:       404,
	CodeSessionNotFound:     404,
	CodeNotFound:            404,
	CodeMethodNotAllowed:    405,
	CodeLeaseHeld:           409,
	CodeLimitMismatch:       409,
	CodeLockDelay:           409,
	CodeLeaseExpired:        409,
	CodeLeaseReleased:       409,
	CodeLeaseRevoked:        409,
	CodeSessionEnded:        409,
	CodeIdempotencyConflict: 409,
	CodeControlLocked:       409,
	CodeIndexPassed:         409,
	CodeEventsCompacted:     410,
	CodePayloadTooLarge:     413,
	CodeLeaseRequired:       428,
	CodeResourceExhausted:   429,
	CodeInternal:            500,
	CodeNoLeader:            503,
	CodeUnavailable:         503,
	CodeOutOfService:        503,
	CodeIndeterminate:       504,
}

// HTTPStatus returns the HTTP status that answers an error with code. A
// code it does not know is 500, and the HTTP API then sends INTERNAL rather
// than the unknown code.
func HTTPStatus(code Code) int {
	if s, ok := statuses[code]; ok {
		return s
	}
	return 500
}

// Known reports whether code is one of the codes above.
func Known(code Code) bool {
	_, ok := statuses[code]
	return ok
}

// Codes returns every error code, sorted.
func Codes() []Code {
	cs := make([]Code, 0, len(statuses))
	for c := range statuses {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i] < cs[j] })
	return cs
}

// CodeForStatus is the code a client reports for an error answer whose
// body is not a contract error (a proxy's page, a node still starting): the
// most general code of that status, INTERNAL for a status no code has.
func CodeForStatus(status int) Code {
	switch status {
	case 400:
		return CodeInvalidArgument
	case 401:
		return CodeUnauthenticated
	case 403:
		return CodePermissionDenied
	case 404:
		return CodeNotFound
	case 413:
		return CodePayloadTooLarge
	case 502, 503:
		return CodeUnavailable
	case 504:
		return CodeIndeterminate
	}
	return CodeInternal
}
