package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/leasehold/leasehold/wire"
)

// DefaultMaxBodyBytes is the request body limit of the contract.
const DefaultMaxBodyBytes = 64 << 10

// errNoBody is returned by decodeBody for an empty body where one is optional.
var errNoBody = errors.New("no body")

// decodeBody decodes the request body into v strictly: at most s.maxBody
// bytes, one JSON value, no unknown fields, nothing after it. An empty body
// is errNoBody when optional and INVALID_ARGUMENT otherwise. Every failure is
// a *wire.Error (400, or 413 for a body over the limit whatever its content).
func (s *core) decodeBody(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	if optional && (r.Body == nil || r.Body == http.NoBody) {
		// No body at all (net/http's NoBody for a request without one, as
		// a renewal usually is): nothing to read or decode.
		return errNoBody
	}
	// Read whole (it is at most s.maxBody bytes): encoding/json would
	// silently turn invalid UTF-8 in a string into U+FFFD.
	buf := bodyBufs.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= maxPooledBody {
			bodyBufs.Put(buf)
		}
	}()
	b, err := readAll((*buf)[:0], http.MaxBytesReader(w, r.Body, s.maxBody))
	*buf = b[:0]
	if err != nil {
		if r.ContentLength > s.maxBody {
			return payloadTooLarge(s.maxBody)
		}
		return decodeError(err)
	}
	if !utf8.Valid(b) {
		return invalidUTF8(b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if errors.Is(err, io.EOF) {
		if optional {
			return errNoBody
		}
		return &wire.Error{Code: wire.CodeInvalidArgument, Message: "a JSON request body is required"}
	}
	if err == nil {
		var extra json.RawMessage
		switch err = dec.Decode(&extra); {
		case errors.Is(err, io.EOF):
			return nil
		case err == nil:
			err = errTrailingData
		}
	}
	if r.ContentLength > s.maxBody {
		// The decoder may have stopped at a syntax error before the limit.
		return payloadTooLarge(s.maxBody)
	}
	return decodeError(err)
}

var errTrailingData = errors.New("data after the request object")

// bodyBufs are decodeBody's read buffers: nothing decoded keeps a reference
// to one (encoding/json's decoder copies what it reads), so each goes back
// for the next request; one grown past maxPooledBody is dropped.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledBody = 16 << 10

// readAll is io.ReadAll appending to b.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
	}
}

// invalidUTF8 is the 400 for a body that is not UTF-8.
func invalidUTF8(b []byte) *wire.Error {
	at := 0
	for at < len(b) {
		r, n := utf8.DecodeRune(b[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	return &wire.Error{Code: wire.CodeInvalidArgument,
		Message: fmt.Sprintf("the request body is not valid UTF-8 (at byte %d)", at)}
}

// refuseBody refuses a request body on a route that takes none (rt has no
// body flag): anything but white space is 400 INVALID_ARGUMENT, naming the
// first field of a JSON object. It reads at most s.maxBody bytes.
func (s *server) refuseBody(r *http.Request, rt route) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, s.maxBody+1))
	if err != nil {
		return decodeError(err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if int64(len(b)) > s.maxBody {
		return payloadTooLarge(s.maxBody)
	}
	e := &wire.Error{Code: wire.CodeInvalidArgument,
		Message: fmt.Sprintf("%s %s takes no request body", rt.method, rt.path)}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err == nil && tok == json.Delim('{') {
		if name, err := dec.Token(); err == nil {
			if name, ok := name.(string); ok {
				e.Field = name
				e.Message = fmt.Sprintf("unknown field %q: %s", name, e.Message)
			}
		}
	}
	return e
}

// decodeError describes a json.Decoder failure as a contract error, naming
// the offending field where the decoder knows it.
func decodeError(err error) *wire.Error {
	var (
		tooLarge  *http.MaxBytesError
		syntax    *json.SyntaxError
		typeError *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &tooLarge):
		return payloadTooLarge(tooLarge.Limit)
	case errors.Is(err, errBodyTimeout):
		return &wire.Error{Code: wire.CodeInvalidArgument, Message: err.Error()}
	case errors.As(err, &syntax):
		return &wire.Error{Code: wire.CodeInvalidArgument,
			Message: fmt.Sprintf("malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())}
	case errors.Is(err, errTrailingData):
		return &wire.Error{Code: wire.CodeInvalidArgument, Message: "malformed JSON: data after the request object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &wire.Error{Code: wire.CodeInvalidArgument, Message: "malformed JSON: unexpected end of body"}
	case errors.As(err, &typeError):
		if typeError.Field == "" {
			return &wire.Error{Code: wire.CodeInvalidArgument,
				Message: "the request body must be a JSON object"}
		}
		return &wire.Error{Code: wire.CodeInvalidArgument, Field: typeError.Field,
			Message: fmt.Sprintf("%s: expected %s, got JSON %s", typeError.Field, describeType(typeError), typeError.Value)}
	}
	// encoding/json reports unknown fields only as text: `json: unknown field "x"`.
	if _, rest, ok := strings.Cut(err.Error(), `unknown field "`); ok {
		name, _, _ := strings.Cut(rest, `"`)
		return &wire.Error{Code: wire.CodeInvalidArgument, Field: name,
			Message: fmt.Sprintf("unknown field %q", name)}
	}
	return &wire.Error{Code: wire.CodeInvalidArgument, Message: "malformed JSON request body"}
}

func describeType(e *json.UnmarshalTypeError) string {
	if e.Type == nil {
		return "another type"
	}
	switch e.Type.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return e.Type.String()
}

// query reads the URL query once per request.
type query struct {
	values url.Values
	err    *wire.Error
}

func newQuery(r *http.Request) *query {
	v, err := url.ParseQuery(r.URL.RawQuery)
	q := &query{values: v}
	if err != nil {
		q.err = &wire.Error{Code: wire.CodeInvalidArgument, Message: "malformed query string"}
	}
	return q
}

func (q *query) str(name string) string { return q.values.Get(name) }

// boolean parses a flag; present without a value ("?stale") means true.
func (q *query) boolean(name string) bool {
	vs, ok := q.values[name]
	if !ok || q.err != nil {
		return false
	}
	if vs[0] == "" {
		return true
	}
	b, err := strconv.ParseBool(vs[0])
	if err != nil {
		q.err = &wire.Error{Code: wire.CodeInvalidArgument, Field: name,
			Message: fmt.Sprintf("%s must be true or false", name)}
	}
	return b
}

// integer parses a non-negative integer; absent means 0.
func (q *query) integer(name string) uint64 {
	v := q.values.Get(name)
	if v == "" || q.err != nil {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 63)
	if err != nil {
		q.err = &wire.Error{Code: wire.CodeInvalidArgument, Field: name,
			Message: fmt.Sprintf("%s must be a non-negative integer", name)}
	}
	return n
}

// stale is the ?stale=true flag of reads.
func (q *query) stale() bool { return q.boolean("stale") }

// limit is the page size of listings.
func (q *query) limit() int {
	n := q.integer("limit")
	if n > 1<<31 {
		n = 1 << 31
	}
	return int(n)
}

// check returns the first parse error, as an error (nil when none).
func (q *query) check() error {
	if q.err != nil {
		return q.err
	}
	return nil
}

func formatBytes(n int64) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
