package api

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// DefaultBodyTimeout is how long a client has to send a request body.
const DefaultBodyTimeout = 30 * time.Second

// DefaultMaxStreamsPerClient bounds the event streams one client address
// keeps open on a server.
const DefaultMaxStreamsPerClient = 128

// errBodyTimeout: the client did not send its body in time.
var errBodyTimeout = errors.New("request body not received in time")

// guardBody refuses up front a body whose declared length is over the
// limit (413, on every route, whether or not it reads a body), and puts a
// read deadline on the body of r, if it has one: the whole body must arrive
// within s.bodyTimeout (with progress: each read, and the handler applies
// its own size limit). Requests without a body (event streams, WebSocket
// upgrades) get no deadline. Once the body is read to its end the deadline
// is lifted, so a handler that then waits (wait_ms, a forward) is not cut
// off by it.
func (s *server) guardBody(w http.ResponseWriter, r *http.Request, progress bool) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	if r.ContentLength > s.maxBody && !progress {
		return payloadTooLarge(s.maxBody)
	}
	if s.bodyTimeout <= 0 || r.Header.Get("Upgrade") != "" {
		// An upgrade (WebSocket) hijacks the connection, which would
		// keep the deadline: it is not put on at all.
		return nil
	}
	b := &deadlineBody{ReadCloser: r.Body, rc: *http.NewResponseController(w), timeout: s.bodyTimeout, progress: progress}
	if b.rc.SetReadDeadline(time.Now().Add(s.bodyTimeout)) != nil {
		return nil // not a connection (a test recorder): nothing to bound
	}
	r.Body = b
	return nil
}

// deadlineBody lifts the connection's read deadline at the end of the body
// and reports a timeout as errBodyTimeout. It must only lift it at the end:
// a body left unread is discarded by the server after the answer, under the
// deadline.
type deadlineBody struct {
	io.ReadCloser
	rc       http.ResponseController // in place: one allocation fewer
	timeout  time.Duration
	progress bool
	done     bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var ne net.Error
	switch {
	case b.done:
	case err == io.EOF:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.As(err, &ne) && ne.Timeout():
		// The deadline stays: what the server discards of the rest of
		// the body after the answer is bounded by it too.
		b.done = true
		err = fmt.Errorf("%w (within %v)", errBodyTimeout, b.timeout)
	case b.progress && n > 0:
		_ = b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	}
	return n, err
}

// streamLimiter counts the open event streams of each client address.
type streamLimiter struct {
	max  int // 0: no limit
	mu   sync.Mutex
	open map[string]int
}

// acquire takes a stream slot for the client of r, or fails with
// RESOURCE_EXHAUSTED. release gives it back.
func (l *streamLimiter) acquire(r *http.Request) (release func(), err error) {
	if l.max <= 0 {
		return func() {}, nil
	}
	client, _, splitErr := net.SplitHostPort(r.RemoteAddr)
	if splitErr != nil {
		client = r.RemoteAddr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[client] >= l.max {
		return nil, &wire.Error{Code: wire.CodeResourceExhausted, Field: "event_streams_per_client", Limit: uint64(l.max),
			Message: fmt.Sprintf("client %s has %d event streams open on this server, its limit", client, l.max)}
	}
	if l.open == nil {
		l.open = make(map[string]int)
	}
	l.open[client]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.open[client]--; l.open[client] <= 0 {
			delete(l.open, client)
		}
	}, nil
}

// fullDuplex lets the handler read the body after the answer started, and
// makes every answer close the connection: an answer written before the end
// of a body that never ends (an error, say) must not wait for it, as net/http
// otherwise does to keep the connection for another request.
func fullDuplex(w http.ResponseWriter) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
	w.Header().Set("Connection", "close")
}

// DefaultWriteTimeout bounds writing an ordinary answer (Options.WriteTimeout).
const DefaultWriteTimeout = 30 * time.Second

// writeDeadline gives the answer to the current request writeTimeout plus
// extra to be written, from now.
func (s *core) writeDeadline(w http.ResponseWriter, extra time.Duration) {
	if s.writeTimeout > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.writeTimeout + extra))
	}
}

// noWriteDeadline lifts the write deadline of the current request.
func (s *core) noWriteDeadline(w http.ResponseWriter) {
	if s.writeTimeout > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	}
}
