package api

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestEveryRouteBodyLimit: every route, whatever it does with a body,
// answers a body of a declared length over the limit with 413
// PAYLOAD_TOO_LARGE and never reaches the node; a chunked one too (a route
// that takes no body reads one to refuse it).
func TestEveryRouteBodyLimit(t *testing.T) {
	s := New(newFake(), Options{}).(*server)
	over := `{"reason":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`
	for _, rt := range s.routes() {
		if rt.method == "GET" || rt.method == "PUT" && rt.path == "/v1/cluster/snapshot" {
			continue // no body; the snapshot upload's limit is MaxSnapshotBytes
		}
		if rt.path == "/v1/keepalive" {
			continue // a stream: its limit is KeepAliveMaxLine per line (TestKeepAliveLineTooLong)
		}
		path := strings.NewReplacer(":id", "x1", ":holder", "h").Replace(rt.path)
		for _, chunked := range []bool{false, true} {
			f := newFake()
			req, err := http.NewRequest(rt.method, "http://leasehold"+path, strings.NewReader(over))
			if err != nil {
				t.Fatal(err)
			}
			if chunked {
				req.ContentLength = -1
			}
			req.Header.Set(headerLeaseToken, "t")
			req.Header.Set(headerSessionToken, "t")
			rec := httptest.NewRecorder()
			New(f, Options{}).ServeHTTP(rec, req)
			if rec.Code != http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s (chunked %v): status %d %s, want 413", rt.method, rt.path, chunked, rec.Code, rec.Body)
				continue
			}
			if e := errorOf(t, rec); e.Code != wire.CodePayloadTooLarge {
				t.Errorf("%s %s: code %s", rt.method, rt.path, e.Code)
			}
			if cs := f.called(); len(cs) != 0 {
				t.Errorf("%s %s: an oversized request reached the node: %v", rt.method, rt.path, cs)
			}
		}
	}
}

// TestResourceExhaustedIs429: the node's RESOURCE_EXHAUSTED is 429 with
// the limit's name and value.
func TestResourceExhaustedIs429(t *testing.T) {
	f := newFake()
	f.err = fsm.Exhausted("leases_per_holder", 5, "holder %q has 5 active leases, its limit", "h")
	rec := do(t, New(f, Options{}), "POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000}`)
	e := wantError(t, rec, http.StatusTooManyRequests, wire.CodeResourceExhausted, "leases_per_holder")
	if e.Limit != 5 {
		t.Errorf("limit %d, want 5", e.Limit)
	}
}

// rawRequest writes head (and body, if any) on a new connection to srv and
// returns the connection and a reader of its answers.
func rawRequest(t *testing.T, addr, head string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// TestBodyTimeout: a client that stops sending its body mid-way gets 400
// once the body timeout passes, and the node is never called.
func TestBodyTimeout(t *testing.T) {
	f := newFake()
	const timeout = 150 * time.Millisecond
	srv := newStreamServer(t, f, Options{BodyTimeout: timeout})
	start := time.Now()
	_, br := rawRequest(t, srv.Listener.Addr().String(),
		"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if took := time.Since(start); took < timeout {
		t.Errorf("answered after %v, before the %v timeout", took, timeout)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "INVALID_ARGUMENT") || !strings.Contains(string(body), "not received in time") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if cs := f.called(); len(cs) != 0 {
		t.Errorf("a stalled request reached the node: %v", cs)
	}
}

// slowNode's Acquire takes longer than the body timeout, as a wait_ms
// acquire does, and fails if its context is cancelled meanwhile.
type slowNode struct {
	*fakeNode
	d time.Duration
}

func (n slowNode) Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, bool, error) {
	select {
	case <-ctx.Done():
		return nil, false, &wire.Error{Code: wire.CodeIndeterminate, Message: "context cancelled: " + context.Cause(ctx).Error()}
	case <-time.After(n.d):
	}
	return n.fakeNode.Acquire(ctx, req)
}

// TestBodyTimeoutLiftedAfterBody: once the body is read, a handler may run
// far longer than the body timeout (a waiting acquire) without its request
// being cancelled (a read deadline left on the connection would cancel it
// through the server's background read), and the connection serves the next
// request.
func TestBodyTimeoutLiftedAfterBody(t *testing.T) {
	const timeout = 50 * time.Millisecond
	srv := httptest.NewServer(New(slowNode{newFake(), 6 * timeout}, Options{BodyTimeout: timeout}))
	t.Cleanup(srv.Close)
	body := `{"key":"k","holder":"h","ttl_ms":1000,"wait_ms":1000}`
	for i := range 2 { // the second on the same keep-alive connection
		resp, err := srv.Client().Post(srv.URL+"/v1/leases", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: status %d %s", i, resp.StatusCode, b)
		}
	}
}

// TestEventStreamOutlivesBodyTimeout: an event stream (no body) is not
// bounded by the body timeout.
func TestEventStreamOutlivesBodyTimeout(t *testing.T) {
	const timeout = 30 * time.Millisecond
	srv := newStreamServer(t, newFake(), Options{BodyTimeout: timeout, KeepAlive: 10 * time.Millisecond})
	resp, _ := openStream(t, srv, "/v1/events")
	br := bufio.NewReader(resp.Body)
	start := time.Now()
	for n := 0; time.Since(start) < 10*timeout; n++ {
		m, err := readSSE(t, br)
		if err != nil || !m.comment {
			t.Fatalf("after %v and %d keep-alives: %+v, %v", time.Since(start), n, m, err)
		}
	}
}

// TestStreamsPerClient: one client address keeps at most
// MaxStreamsPerClient streams open; closing one makes room.
func TestStreamsPerClient(t *testing.T) {
	f := newFake()
	h := New(f, Options{MaxStreamsPerClient: 2, KeepAlive: time.Hour})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := h.(*server)
	open := func() int {
		s.streams.mu.Lock()
		defer s.streams.mu.Unlock()
		return s.streams.open["127.0.0.1"]
	}
	_, cancel1 := openStream(t, srv, "/v1/events")
	openStream(t, srv, "/v1/events")
	waitFor(t, "two streams", func() bool { return open() == 2 })
	resp, err := srv.Client().Get(srv.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"field":"event_streams_per_client","limit":2`) {
		t.Fatalf("third stream: %d %s", resp.StatusCode, b)
	}
	cancel1()
	waitFor(t, "the first stream to end", func() bool { return open() == 1 })
	resp3, _ := openStream(t, srv, "/v1/events")
	if resp3.StatusCode != http.StatusOK {
		t.Fatalf("stream after one ended: %d", resp3.StatusCode)
	}
}

// TestSnapshotUploadProgressDeadline: a snapshot upload may take longer
// than the body timeout as long as data keeps coming; one that stalls for
// longer is answered 400 and never reaches a restore.
func TestSnapshotUploadProgressDeadline(t *testing.T) {
	// Chunks a quarter of the timeout apart: a loaded machine may delay
	// the sender or the server's reader by most of a second between two
	// of them before the upload would rightly count as stalled.
	const timeout = time.Second
	f := newFake()
	srv := httptest.NewServer(New(f, Options{BodyTimeout: timeout}))
	t.Cleanup(srv.Close)
	head := "PUT /v1/cluster/snapshot HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 400\r\n\r\n"
	chunk := strings.Repeat("s", 50)

	// Eight chunks 250 ms apart: 2 s in all, more than the timeout.
	c, br := rawRequest(t, srv.Listener.Addr().String(), head)
	tick := time.NewTicker(timeout / 4)
	defer tick.Stop()
	for range 8 {
		<-tick.C
		if _, err := io.WriteString(c, chunk); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"size":400`) {
		t.Fatalf("slow but steady upload: %d %s", resp.StatusCode, b)
	}

	// One chunk, then nothing.
	f2 := newFake()
	srv2 := httptest.NewServer(New(f2, Options{BodyTimeout: timeout}))
	t.Cleanup(srv2.Close)
	_, br = rawRequest(t, srv2.Listener.Addr().String(), head+chunk)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "stalled") {
		t.Fatalf("stalled upload: %d %s", resp.StatusCode, b)
	}
	if cs := f2.called(); len(cs) != 0 {
		t.Fatalf("a stalled upload was restored: %v", cs)
	}
}
