package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/leasehold/leasehold/wire"
)

// retryAfterSeconds is the Retry-After sent with 503 answers: leader
// elections on a healthy network settle well within it.
const retryAfterSeconds = "1"

// statusFor maps a contract error code to its HTTP status: the one table,
// wire.HTTPStatus. Codes it does not know are 500.
func statusFor(code wire.Code) int { return wire.HTTPStatus(code) }

// errorBody is the JSON shape of every error answer.
type errorBody struct {
	Error *wire.Error `json:"error"`
}

// toAPIError turns any error into the *wire.Error to send and its status.
// Only *wire.Error values with a known code pass through; everything else is
// a generic INTERNAL (or INDETERMINATE for a context error, since a write cut
// short that way may or may not have been applied). The last result
// reports whether err was unexpected and worth logging.
func toAPIError(err error) (*wire.Error, int, bool) {
	var ne *wire.Error
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &ne) && ne != nil:
		status := statusFor(ne.Code)
		if status == http.StatusInternalServerError {
			return internalError(), status, true
		}
		return ne, status, false
	case errors.As(err, &tooLarge):
		return payloadTooLarge(tooLarge.Limit), http.StatusRequestEntityTooLarge, false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &wire.Error{
			Code:    wire.CodeIndeterminate,
			Message: "the request was cut short; a write may or may not have been applied",
		}, http.StatusGatewayTimeout, false
	default:
		return internalError(), http.StatusInternalServerError, true
	}
}

func internalError() *wire.Error {
	return &wire.Error{Code: wire.CodeInternal, Message: "internal error"}
}

// writeError answers with err. Unexpected errors are logged with the route
// (never with the request body or headers) and answered generically.
func (s *core) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e, status, unexpected := toAPIError(err)
	if unexpected {
		s.logFailure(r, w, err)
	}
	writeErrorBody(w, status, e)
}

// logFailure logs an unexpected error of a request.
func (s *core) logFailure(r *http.Request, w http.ResponseWriter, err error) {
	s.log.LogAttrs(r.Context(), slog.LevelError, "request failed",
		slog.String("method", r.Method), slog.String("route", routeOf(w)),
		slog.Any("error", err))
}

// writeErrorBody writes e with status; 503 answers carry Retry-After.
func writeErrorBody(w http.ResponseWriter, status int, e *wire.Error) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	writeJSON(w, status, errorBody{Error: e})
}

// The values of writeJSON's constant headers.
var (
	headerJSON    = []string{"application/json"}
	headerNoStore = []string{"no-store"}
)

// leaseAnswers are the buffers writeJSON encodes leases into: a writer
// does not keep what it is given (io.Writer's contract; net/http copies it
// into the connection's buffer), so a buffer serves the next answer once
// written.
var leaseAnswers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledAnswer bounds the buffers kept in leaseAnswers (a lease with
// large metadata makes a large one).
const maxPooledAnswer = 4 << 10

// contentLengths are the Content-Length values of answers up to
// maxPooledAnswer bytes, each made once, on first use, and shared (nothing
// changes a header value in place).
var contentLengths [maxPooledAnswer + 1]atomic.Pointer[[]string]

// contentLength is the Content-Length header value of n bytes.
func contentLength(n int) []string {
	if n > maxPooledAnswer {
		return []string{strconv.Itoa(n)}
	}
	if v := contentLengths[n].Load(); v != nil {
		return *v
	}
	v := []string{strconv.Itoa(n)}
	v = v[:1:1]
	contentLengths[n].Store(&v)
	return v
}

// writeJSON answers with v encoded as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var (
		b   []byte
		buf *[]byte // from leaseAnswers
		err error
	)
	if l, ok := v.(*wire.Lease); ok {
		// A lease, the answer of every acquire, renew and release:
		// the same bytes without encoding/json's reflection.
		buf = leaseAnswers.Get().(*[]byte)
		if b, ok = appendLeaseJSON((*buf)[:0], l); !ok {
			b, err = json.Marshal(v)
		}
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		// Only a programming error (an unencodable type) gets here.
		b = []byte(`{"error":{"code":"INTERNAL","message":"internal error"}}`)
		status = http.StatusInternalServerError
	}
	b = append(b, '\n')
	h := w.Header()
	// The constant values are shared slices (net/http copies the header
	// when it writes it, and nothing here changes a value in place).
	h["Content-Type"] = headerJSON
	h["Cache-Control"] = headerNoStore
	h["Content-Length"] = contentLength(len(b))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	if buf != nil && cap(b) <= maxPooledAnswer {
		*buf = b[:0]
		leaseAnswers.Put(buf)
	}
}

func payloadTooLarge(limit int64) *wire.Error {
	return &wire.Error{Code: wire.CodePayloadTooLarge, Message: "request body exceeds " + formatBytes(limit)}
}
