package api

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
)

// headerRequestID names a request in the logs of every server it passes
// through: a client's own id is kept when it is usable, otherwise one is
// made; either way the answer carries it and a forward to the leader
// passes it on.
const headerRequestID = "X-Request-Id"

// maxRequestIDLen bounds a client's request id, in bytes.
const maxRequestIDLen = 128

// requestIDKey carries the request id in a request's context.
type requestIDKey struct{}

// validRequestID reports whether a client's id is kept: 1 to
// maxRequestIDLen bytes of printable ASCII without spaces.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// tagRequest settles r's request id (the client's if valid, else a new
// one), sets it on the answer and on r's header (a forward passes it on),
// and returns r with the id in its context, where the API's logger finds
// it.
func tagRequest(w http.ResponseWriter, r *http.Request) *http.Request {
	return tagRequestIn(new(requestCtx), w, r)
}

// tagRequestIn is tagRequest with the context c, which it fills (the
// server's exchange holds one, so that a request's state is one
// allocation).
func tagRequestIn(c *requestCtx, w http.ResponseWriter, r *http.Request) *http.Request {
	c.Context, c.id = r.Context(), r.Header.Get(headerRequestID)
	var v []string
	if !validRequestID(c.id) {
		c.id = newRequestID()
		c.value[0] = c.id
		v = c.value[:]
		r.Header[headerRequestID] = v // headerRequestID is canonical
	} else {
		v = r.Header[headerRequestID][:1:1]
	}
	// One slice for both headers: nothing changes a header value in place.
	w.Header()[headerRequestID] = v
	return r.WithContext(c)
}

// requestCtx is a request's context with its id: context.WithValue's
// result in one allocation rather than two (the context, and the id boxed
// in an interface), which also holds a made id's header value.
type requestCtx struct {
	context.Context
	id    string
	value [1]string
}

func (c *requestCtx) Value(key any) any {
	if key == (requestIDKey{}) {
		return c.id
	}
	return c.Context.Value(key)
}

// requestIDs numbers the ids this process makes; requestIDPrefix, random
// per process, keeps them apart from another's.
var (
	requestIDs      atomic.Uint64
	requestIDPrefix = rand.Text()[:13] // 65 random bits
)

// newRequestID is a fresh request id, unique to the process: its prefix,
// a dash and a sequence number in base 36. Not a secret (it is logged and
// echoed): a counter is enough, and far cheaper than 26 random characters.
func newRequestID() string {
	var b [32]byte
	return string(strconv.AppendUint(append(append(b[:0], requestIDPrefix...), '-'), requestIDs.Add(1), 36))
}

// requestIDFrom is the request id in ctx ("" outside a request).
func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// requestLogger returns l with every record logged with a request's
// context carrying that request's id (attribute request_id).
func requestLogger(l *slog.Logger) *slog.Logger {
	return slog.New(requestIDHandler{l.Handler()})
}

type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, rec slog.Record) error {
	if id := requestIDFrom(ctx); id != "" {
		rec = rec.Clone()
		rec.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, rec)
}

func (h requestIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(as)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
