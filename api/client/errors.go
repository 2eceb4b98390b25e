package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// APIError is a non-2xx answer from a node. It unwraps to the decoded
// *wire.Error, so errors.As and errors.Is on node errors see through it.
type APIError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// RetryAfter is the server's Retry-After, 0 if absent.
	RetryAfter time.Duration
	// Addr is the base URL of the node that answered.
	Addr string
	// Err is the decoded error; never nil. A body that is not a contract
	// error gets a code derived from the status and the body's start as
	// message.
	Err *wire.Error
}

func (e *APIError) Error() string { return e.Err.Error() }

// Unwrap returns the *wire.Error.
func (e *APIError) Unwrap() error { return e.Err }

// StatusCode returns the HTTP status of an error answered by a node, or 0 if
// err did not come from an answer (a transport failure, say).
func StatusCode(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return 0
}

// ErrorCode returns the contract code of err, or "" if err carries none.
func ErrorCode(err error) wire.Code { return wire.ErrorCode(err) }

// Bounds returns, for an INVALID_ARGUMENT about a value out of range, the
// field and the range it must be in (for a string, its length in bytes),
// from the error's "field", "min" and "max": no need to parse the message.
// ok is false for any other error.
func Bounds(err error) (field string, min, max int64, ok bool) {
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeInvalidArgument {
		return "", 0, 0, false
	}
	min, max, ok = we.Bounds()
	return we.Field, min, max, ok
}

func decodeError(addr string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ae := &APIError{StatusCode: resp.StatusCode, Addr: addr}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n >= 0 {
			ae.RetryAfter = time.Duration(n) * time.Second
		}
	}
	var env struct {
		Error *wire.Error `json:"error"`
	}
	if json.Unmarshal(data, &env) == nil && env.Error != nil && env.Error.Code != "" {
		ae.Err = env.Error
		return ae
	}
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(data, nil)))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	ae.Err = &wire.Error{Code: wire.CodeForStatus(resp.StatusCode), Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, msg)}
	return ae
}
