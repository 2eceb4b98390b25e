package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// ErrRenewStreamClosed is the error of a renewal on a closed RenewStream.
var ErrRenewStreamClosed = errors.New("client: renew stream closed")

// renewStreamPing is how long a stream may stay silent before the client
// sends an empty line, which keeps the server from ending it as idle.
const renewStreamPing = 10 * time.Second

// RenewStream renews standalone leases over a keep-alive stream (POST
// /v1/keepalive): one long-lived request carries many renewals and their
// answers, so that a renewal costs no HTTP request of its own. It is safe
// for concurrent use by many goroutines: the renewals written while the
// connection is busy go out together, and the server commits renewals that
// arrive together in one log entry. A renewal is answered only once it is
// committed, with the same errors as Client.Renew.
//
// The stream is opened on the first renewal and opened again, on the next
// renewal, after it was lost; a renewal in flight on a lost stream fails
// INDETERMINATE (it may or may not have been applied). Close ends it.
type RenewStream struct {
	c *Client

	mu     sync.Mutex
	conn   *renewConn // nil: none open
	nextID uint64
	closed bool
}

// KeepAliveStream returns a RenewStream on the client's addresses. It opens
// the stream at once, so that an unreachable cluster or a refused token is
// reported here; ctx bounds only that.
func (c *Client) KeepAliveStream(ctx context.Context) (*RenewStream, error) {
	rs := &RenewStream{c: c}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, err := rs.connLocked(ctx); err != nil {
		return nil, err
	}
	return rs, nil
}

// Renew renews one lease over the stream (ttlMS, if not 0, is its new TTL)
// and returns the server's answer once the renewal is committed. An error
// answered by the server is an *APIError, as from Client.Renew; a renewal
// whose stream was lost, or whose ctx ended, after it was written fails
// INDETERMINATE.
func (rs *RenewStream) Renew(ctx context.Context, leaseID, token string, ttlMS int64) (*wire.KeepAliveAnswer, error) {
	return rs.RenewWith(ctx, wire.RenewRequest{LeaseID: leaseID, Token: token, TTLMS: ttlMS})
}

// keepAliveMaxLine is the server's bound on one line of a keep-alive
// stream (api.KeepAliveMaxLine): a longer line would end the stream.
const keepAliveMaxLine = 4 << 10

// RenewWith is Renew with metadata: req.Metadata, if not nil, replaces the
// lease's metadata with the renewal (see Client.RenewWith). A renewal whose
// line would exceed the stream's 4096 bytes is refused (INVALID_ARGUMENT,
// field metadata) without being sent: renew with Client.RenewWith then.
func (rs *RenewStream) RenewWith(ctx context.Context, req wire.RenewRequest) (*wire.KeepAliveAnswer, error) {
	leaseID := req.LeaseID
	rs.mu.Lock()
	rs.nextID++
	id := rs.nextID
	rs.mu.Unlock()
	r := wire.KeepAliveRenewal{ID: id, LeaseID: leaseID, Token: req.Token, TTLMS: req.TTLMS, Metadata: req.Metadata}
	line, ok := appendRenewalLine(make([]byte, 0, 128), r)
	var err error
	if !ok {
		if line, err = json.Marshal(r); err != nil {
			return nil, fmt.Errorf("client: encode renewal: %w", err)
		}
	}
	line = append(line, '\n')
	if len(line) > keepAliveMaxLine {
		return nil, &APIError{StatusCode: http.StatusBadRequest, Err: &wire.Error{Code: wire.CodeInvalidArgument, Field: "metadata",
			Message: fmt.Sprintf("the renewal is %d bytes, more than a keep-alive line holds (%d): renew it on its own", len(line), keepAliveMaxLine)}}
	}
	done := make(chan streamResult, 1)
	var conn *renewConn
	for attempt := 0; ; attempt++ {
		rs.mu.Lock()
		if rs.closed {
			rs.mu.Unlock()
			return nil, ErrRenewStreamClosed
		}
		conn, err = rs.connLocked(ctx)
		rs.mu.Unlock()
		if err != nil {
			return nil, err
		}
		// A stream lost in between sent nothing of this renewal: once
		// more on a new one.
		if err = conn.send(id, line, done); err == nil {
			break
		} else if attempt > 0 {
			return nil, err
		}
	}
	select {
	case r := <-done:
		return r.ans, r.err
	case <-ctx.Done():
		conn.forget(id)
		return nil, &wire.Error{Code: wire.CodeIndeterminate,
			Message: "the renewal was abandoned after it was sent; it may or may not have been applied: " + ctx.Err().Error()}
	}
}

// Close ends the stream: the server answers the renewals in flight, then
// the connection is closed. Renewals after Close fail ErrRenewStreamClosed.
func (rs *RenewStream) Close() error {
	rs.mu.Lock()
	rs.closed = true
	conn := rs.conn
	rs.conn = nil
	rs.mu.Unlock()
	if conn != nil {
		conn.close()
	}
	return nil
}

// connLocked returns the open connection, opening one if there is none or
// the last was lost. rs.mu is held.
func (rs *RenewStream) connLocked(ctx context.Context) (*renewConn, error) {
	if rs.conn != nil && !rs.conn.lost() {
		return rs.conn, nil
	}
	conn, err := rs.c.openRenewConn(ctx)
	if err != nil {
		return nil, err
	}
	rs.conn = conn
	return conn, nil
}

type streamResult struct {
	ans *wire.KeepAliveAnswer
	err error
}

// renewConn is one keep-alive request: lines go out through pw, answers
// come back on body.
type renewConn struct {
	addr   string
	pw     *io.PipeWriter
	body   io.ReadCloser
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[uint64]chan streamResult
	queued  []byte        // lines not yet written
	wake    chan struct{} // the writer has lines to write
	err     error         // why the connection was lost; nil while it works
	closing bool          // Close: the writer ends the body after the queue
	done    chan struct{} // closed when the reader ends
}

// openRenewConn opens a keep-alive request on the first address that
// accepts it. Nothing has been sent on it yet, so a failure moves on to the
// next address.
func (c *Client) openRenewConn(ctx context.Context) (*renewConn, error) {
	start := int(c.next.Load())
	var lastErr error
	for i := range c.addrs {
		idx := (start + i) % len(c.addrs)
		conn, err := c.openRenewConnAt(ctx, c.addrs[idx])
		if err == nil {
			c.next.Store(int64(idx))
			return conn, nil
		}
		lastErr = err
		if ctx.Err() != nil || !unavailable(err) {
			return nil, err
		}
	}
	return nil, lastErr
}

func (c *Client) openRenewConnAt(ctx context.Context, base string) (*renewConn, error) {
	// The request outlives ctx, which bounds only the opening.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/keepalive", pr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("client: %w", err)
	}
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Accept", "application/x-ndjson")
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	type opened struct {
		resp *http.Response
		err  error
	}
	ch := make(chan opened, 1)
	go func() {
		resp, err := c.hc.Do(req)
		ch <- opened{resp, err}
	}()
	var o opened
	select {
	case o = <-ch:
	case <-ctx.Done():
		cancel()
		pw.Close()
		return nil, ctx.Err()
	}
	if o.err != nil {
		cancel()
		pw.Close()
		return nil, o.err
	}
	if o.resp.StatusCode != http.StatusOK {
		err := decodeError(base, o.resp)
		o.resp.Body.Close()
		cancel()
		pw.Close()
		return nil, err
	}
	conn := &renewConn{addr: base, pw: pw, body: o.resp.Body, cancel: cancel,
		pending: map[uint64]chan streamResult{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go conn.write()
	go conn.read()
	return conn, nil
}

// lost reports whether the connection can no longer carry renewals.
func (rc *renewConn) lost() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err != nil
}

// send queues one line and registers its answer's channel.
func (rc *renewConn) send(id uint64, line []byte, done chan streamResult) error {
	rc.mu.Lock()
	if rc.err != nil {
		err := rc.err
		rc.mu.Unlock()
		// Nothing was written: the caller may try again on a new stream.
		return &wire.Error{Code: wire.CodeUnavailable, Message: "the keep-alive stream was lost before the renewal was sent: " + err.Error()}
	}
	rc.pending[id] = done
	rc.queued = append(rc.queued, line...)
	rc.mu.Unlock()
	select {
	case rc.wake <- struct{}{}:
	default:
	}
	return nil
}

// forget drops the answer channel of an abandoned renewal.
func (rc *renewConn) forget(id uint64) {
	rc.mu.Lock()
	delete(rc.pending, id)
	rc.mu.Unlock()
}

// write writes the queued lines, all that queued meanwhile in one write,
// and an empty line after renewStreamPing of silence.
func (rc *renewConn) write() {
	ping := time.NewTimer(renewStreamPing)
	defer ping.Stop()
	var buf []byte
	for {
		select {
		case <-rc.wake:
		case <-ping.C:
			rc.mu.Lock()
			rc.queued = append(rc.queued, '\n')
			rc.mu.Unlock()
		case <-rc.done:
			return
		}
		// Renewals come in waves (their callers were answered by one
		// commit): let the others queue theirs, so one write carries all.
		runtime.Gosched()
		rc.mu.Lock()
		buf, rc.queued = rc.queued, buf[:0]
		closing := rc.closing
		rc.mu.Unlock()
		if len(buf) > 0 {
			if _, err := rc.pw.Write(buf); err != nil {
				rc.fail(fmt.Errorf("write: %w", err))
				return
			}
		}
		if closing {
			rc.pw.Close()
			return
		}
		ping.Reset(renewStreamPing)
	}
}

// read matches answers to their renewals until the stream ends.
func (rc *renewConn) read() {
	defer close(rc.done)
	defer rc.body.Close()
	br := bufio.NewReaderSize(rc.body, 16<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 1 {
			rc.deliver(line)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the server ended the stream")
			}
			rc.fail(err)
			return
		}
	}
}

// deliver hands one answer line to its renewal.
func (rc *renewConn) deliver(line []byte) {
	var a wire.KeepAliveAnswer
	if b := trimLine(line); parseAnswerLine(b, &a) {
		// The usual answer, read without reflection.
	} else if err := json.Unmarshal(line, &a); err != nil {
		rc.fail(fmt.Errorf("bad answer line: %w", err))
		return
	}
	if a.ID == 0 {
		return // about a line this client never sends
	}
	rc.mu.Lock()
	done, ok := rc.pending[a.ID]
	delete(rc.pending, a.ID)
	rc.mu.Unlock()
	if !ok {
		return
	}
	if a.Error != nil || !a.OK {
		e := a.Error
		if e == nil {
			e = &wire.Error{Code: wire.CodeInternal, Message: "answer neither ok nor an error"}
		}
		status := a.Status
		if status == 0 {
			status = wire.HTTPStatus(e.Code)
		}
		done <- streamResult{err: &APIError{StatusCode: status, Addr: rc.addr, Err: e}}
		return
	}
	done <- streamResult{ans: &a}
}

// trimLine is line without its line end ("\n" or "\r\n").
func trimLine(line []byte) []byte {
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
	}
	return line
}

// fail marks the connection lost and fails every renewal in flight
// INDETERMINATE; the first error wins.
func (rc *renewConn) fail(err error) {
	rc.mu.Lock()
	if rc.err == nil {
		rc.err = err
	}
	pending := rc.pending
	rc.pending = map[uint64]chan streamResult{}
	rc.mu.Unlock()
	for id, done := range pending {
		done <- streamResult{err: &wire.Error{Code: wire.CodeIndeterminate,
			Message: "keep-alive stream to " + rc.addr + " lost with renewal " + strconv.FormatUint(id, 10) +
				" in flight; it may or may not have been applied: " + err.Error()}}
	}
	rc.cancel()
	rc.pw.CloseWithError(err)
}

// close ends the client's side, lets the server answer what is in flight
// (for at most DefaultTimeout), then closes the connection.
func (rc *renewConn) close() {
	rc.mu.Lock()
	if rc.err == nil {
		rc.err = ErrRenewStreamClosed
	}
	rc.closing = true
	rc.mu.Unlock()
	// The writer writes what is queued, then ends the body.
	select {
	case rc.wake <- struct{}{}:
	default:
	}
	go func() {
		t := time.NewTimer(DefaultTimeout)
		defer t.Stop()
		select {
		case <-rc.done:
		case <-t.C:
		}
		rc.fail(ErrRenewStreamClosed)
	}()
}
