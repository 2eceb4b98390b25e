package api

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// hungLeader is a leader that takes connections and requests and never
// answers (a SIGSTOPped process, as far as its peers can tell). got
// receives the request line of every request it read.
type hungLeader struct {
	addr string
	got  chan string
}

func newHungLeader(t *testing.T) *hungLeader {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hungLeader{addr: ln.Addr().String(), got: make(chan string, 64)}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "GET ") || strings.HasPrefix(line, "POST ") || strings.HasPrefix(line, "DELETE ") {
						select {
						case h.got <- strings.TrimSpace(line):
						default:
						}
					}
				}
			}()
		}
	}()
	return h
}

// serveWithin runs one request through h and fails the test if it has no
// answer within limit.
func serveWithin(t *testing.T, h http.Handler, req *http.Request, limit time.Duration) (*httptest.ResponseRecorder, time.Duration) {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	start := time.Now()
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		done <- rec
	}()
	select {
	case rec := <-done:
		return rec, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("%s %s: no answer within %v", req.Method, req.URL.Path, limit)
		return nil, 0
	}
}

func wantForwardError(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status || !strings.Contains(rec.Body.String(), `"`+code+`"`) {
		t.Fatalf("%s: %d %s, want %d %s", what, rec.Code, rec.Body, status, code)
	}
	if status == http.StatusServiceUnavailable && rec.Header().Get("Retry-After") == "" {
		t.Fatalf("%s: 503 without Retry-After", what)
	}
}

// A leader that takes the request and never answers holds a forward no
// longer than the forward timeout (plus the acquire's wait_ms): a write that
// was sent is INDETERMINATE, a read NO_LEADER.
func TestForwardToHungLeaderIsBounded(t *testing.T) {
	hung := newHungLeader(t)
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: hung.addr}, known: true}
	// Long enough that a loaded machine sends the request (dial and
	// write) within it: a write not sent is NO_LEADER, not INDETERMINATE.
	const forwardTimeout = time.Second
	h := New(f, Options{ForwardTimeout: forwardTimeout})
	// The bound here is a minute's fraction; without one the forward
	// waits for as long as the client does.
	const limit = 20 * time.Second

	rec, _ := serveWithin(t, h, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)), limit)
	wantForwardError(t, "acquire", rec, http.StatusGatewayTimeout, "INDETERMINATE")
	rec, _ = serveWithin(t, h, httptest.NewRequest("DELETE", "/v1/leases/ls_1", nil), limit)
	// (No token: the follower does not check, the leader would.)
	wantForwardError(t, "release", rec, http.StatusGatewayTimeout, "INDETERMINATE")
	rec, _ = serveWithin(t, h, httptest.NewRequest("GET", "/v1/leases/ls_1", nil), limit)
	wantForwardError(t, "read", rec, http.StatusServiceUnavailable, "NO_LEADER")
	rec, _ = serveWithin(t, h, httptest.NewRequest("POST", "/v1/validate", strings.NewReader(`{"key":"k","fencing_token":3}`)), limit)
	wantForwardError(t, "validate", rec, http.StatusServiceUnavailable, "NO_LEADER")

	// An acquire that may wait is given its wait on top (timers never
	// fire early, so the lower bound is exact).
	rec, took := serveWithin(t, h, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000,"wait_ms":700}`)), limit)
	wantForwardError(t, "acquire with wait_ms", rec, http.StatusGatewayTimeout, "INDETERMINATE")
	if took < 700*time.Millisecond+forwardTimeout {
		t.Fatalf("acquire with wait_ms 700 given up after %v, before wait_ms + the forward timeout", took)
	}
	if len(f.called()) != 0 {
		t.Fatalf("the follower served something itself: %v", f.called())
	}
}

// The forward of an acquire that waits lasts as long as its wait_ms: the
// leader's answer after the forward timeout but within wait_ms comes back.
func TestForwardGivesAnAcquireItsWait(t *testing.T) {
	// The leader answers three forward timeouts late; the timeout is long
	// enough that a loaded machine sends the request within it (a write
	// not sent is NO_LEADER, not INDETERMINATE).
	const forwardTimeout = time.Second
	leaderAPI := New(newFake(), Options{})
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(3 * forwardTimeout) // the late answer under test
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{ForwardTimeout: forwardTimeout})
	rec, _ := serveWithin(t, h, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000,"wait_ms":10000}`)), 30*time.Second)
	if rec.Code != http.StatusCreated {
		t.Fatalf("acquire with wait_ms: %d %s", rec.Code, rec.Body)
	}
	rec, _ = serveWithin(t, h, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)), 30*time.Second)
	wantForwardError(t, "acquire past the forward timeout", rec, http.StatusGatewayTimeout, "INDETERMINATE")
}

// A follower that learns of a new leader abandons what it forwarded to the
// old one at once: writes are INDETERMINATE, reads are answered by the new
// leader.
func TestForwardAbandonedWhenLeaderChanges(t *testing.T) {
	hung := newHungLeader(t)
	newLeader := newFake()
	newAPI := New(newLeader, Options{})
	good := httptest.NewServer(newAPI)
	defer good.Close()
	old := node.LeaderInfo{ID: "l1", HTTPAddr: hung.addr}
	next := node.LeaderInfo{ID: "l2", HTTPAddr: strings.TrimPrefix(good.URL, "http://")}
	f := &followerFake{fakeNode: newFake(), leader: old, known: true}
	// The forward timeout is far beyond the test's bound: only the leader
	// change can end these forwards in time.
	h := New(f, Options{ForwardTimeout: 5 * time.Minute})

	for _, tc := range []struct {
		method, path, body string
		status             int
		code, leaderCall   string
	}{
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5000}`, http.StatusGatewayTimeout, "INDETERMINATE", ""},
		{"DELETE", "/v1/leases/ls_1", "", http.StatusGatewayTimeout, "INDETERMINATE", ""},
		{"GET", "/v1/leases/ls_1", "", http.StatusOK, "", "GetLease"},
		{"POST", "/v1/validate", `{"key":"k","fencing_token":3}`, http.StatusOK, "", "Validate"},
	} {
		f.setLeader(old, true)
		drain(hung.got)
		before := len(newLeader.called())
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			rec := httptest.NewRecorder()
			var body *strings.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req := httptest.NewRequest(tc.method, tc.path, nil)
			if body != nil {
				req = httptest.NewRequest(tc.method, tc.path, body)
			}
			h.ServeHTTP(rec, req)
			done <- rec
		}()
		select {
		case <-hung.got:
		case rec := <-done:
			t.Fatalf("%s %s: answered before it reached the leader: %d %s", tc.method, tc.path, rec.Code, rec.Body)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s %s never reached the leader", tc.method, tc.path)
		}
		f.setLeader(next, true)
		var rec *httptest.ResponseRecorder
		select {
		case rec = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s %s: still waiting on the old leader 20 s after the new one was known", tc.method, tc.path)
		}
		what := tc.method + " " + tc.path
		if tc.code != "" {
			wantForwardError(t, what, rec, tc.status, tc.code)
			if n := len(newLeader.called()); n != before {
				t.Fatalf("%s: a write was sent again to the new leader", what)
			}
			continue
		}
		if rec.Code != tc.status {
			t.Fatalf("%s: %d %s, want the new leader's answer", what, rec.Code, rec.Body)
		}
		cs := newLeader.called()
		if len(cs) != before+1 || cs[len(cs)-1].method != tc.leaderCall {
			t.Fatalf("%s: new leader's calls %v, want one more %s", what, cs, tc.leaderCall)
		}
	}
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// A write none of which was sent (the connection to the old leader never
// opened) is NO_LEADER, retryable, whether the leader changed or the
// forward timed out.
func TestForwardNothingSentIsNoLeader(t *testing.T) {
	dialing := make(chan struct{}, 8)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		dialing <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	old := node.LeaderInfo{ID: "l1", HTTPAddr: "192.0.2.1:7700"}
	f := &followerFake{fakeNode: newFake(), leader: old, known: true}
	h := New(f, Options{ForwardTimeout: 5 * time.Minute, ForwardDial: dial})
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)))
		done <- rec
	}()
	select {
	case <-dialing:
	case <-time.After(20 * time.Second):
		t.Fatal("the forward never dialled")
	}
	f.setLeader(node.LeaderInfo{ID: "l2", HTTPAddr: "192.0.2.2:7700"}, true)
	select {
	case rec := <-done:
		wantForwardError(t, "acquire abandoned while dialling", rec, http.StatusServiceUnavailable, "NO_LEADER")
	case <-time.After(20 * time.Second):
		t.Fatal("acquire still dialling the old leader 20 s after the new one was known")
	}

	h = New(f, Options{ForwardTimeout: 200 * time.Millisecond, ForwardDial: dial})
	rec, _ := serveWithin(t, h, httptest.NewRequest("DELETE", "/v1/leases/ls_1", nil), 20*time.Second)
	wantForwardError(t, "release timed out while dialling", rec, http.StatusServiceUnavailable, "NO_LEADER")
}

// A forwarded write reaches the leader at most once: http.Transport replays
// a bodyless request that carries an Idempotency-Key header when a reused
// connection fails, so the header is not passed on with writes.
func TestForwardNeverReplaysAWrite(t *testing.T) {
	leaderAPI := New(newFake(), Options{})
	var mu sync.Mutex
	seen := map[string]bool{}      // remote addresses (connections) seen
	deliveries := map[string]int{} // DELETE deliveries per lease
	cut := map[string]bool{}       // leases whose first delivery was cut on a reused connection
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reused := seen[r.RemoteAddr]
		seen[r.RemoteAddr] = true
		first := false
		if r.Method == "DELETE" {
			deliveries[r.URL.Path]++
			first = deliveries[r.URL.Path] == 1
			if first && reused {
				cut[r.URL.Path] = true
			}
		}
		mu.Unlock()
		if r.Method == "DELETE" && first && reused {
			// The request arrived; the connection dies before the answer.
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{})
	verified := map[string]bool{}
	for round := 0; round < 40 && len(verified) < 2; round++ {
		rec, _ := serveWithin(t, h, httptest.NewRequest("GET", "/v1/leases/ls_0", nil), 30*time.Second)
		if rec.Code != 200 {
			t.Fatalf("warm-up read: %d %s", rec.Code, rec.Body)
		}
		path := "/v1/leases/ls_" + string(rune('a'+round))
		for _, hdr := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
			if verified[hdr] {
				continue
			}
			req := httptest.NewRequest("DELETE", path+hdr, nil)
			req.Header.Set(headerLeaseToken, "tok")
			req.Header.Set(hdr, "k-"+path)
			rec, _ = serveWithin(t, h, req, 30*time.Second)
			mu.Lock()
			wasCut, n := cut[path+hdr], deliveries[path+hdr]
			mu.Unlock()
			if !wasCut {
				continue // not sent on a reused connection: nothing to see
			}
			if n != 1 {
				t.Fatalf("release with %s delivered %d times to the leader (answer %d %s)", hdr, n, rec.Code, rec.Body)
			}
			wantForwardError(t, "release cut after delivery", rec, http.StatusGatewayTimeout, "INDETERMINATE")
			verified[hdr] = true
			break // the next one needs a connection that was used before
		}
	}
	if len(verified) < 2 {
		t.Fatalf("only %v went over a reused connection in 40 rounds", verified)
	}
}

// A forwarded read whose connection was cut is sent again, POST
// /v1/validate included: it changes nothing, so it is never INDETERMINATE.
func TestForwardReadRetriedAfterCut(t *testing.T) {
	leaderNode := newFake()
	leaderAPI := New(leaderNode, Options{})
	var validates atomic.Int32
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/validate" && validates.Add(1) == 1 {
			var b bytes.Buffer
			_, _ = b.ReadFrom(r.Body)
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{})
	rec, _ := serveWithin(t, h, httptest.NewRequest("POST", "/v1/validate", strings.NewReader(`{"key":"k","fencing_token":3}`)), 30*time.Second)
	if rec.Code != http.StatusOK || validates.Load() != 2 {
		t.Fatalf("validate cut once: %d %s after %d deliveries, want the second one's answer", rec.Code, rec.Body, validates.Load())
	}
	if c := leaderNode.only(t, "Validate"); c.args[0].(wire.ValidateRequest).FencingToken != 3 {
		t.Fatalf("validate sent again without its body: %+v", c.args)
	}
}

// A leader just elected answers reads 503 until it has applied its
// predecessors' entries: a forwarded read is tried again shortly; a write's
// 503 is passed on (the client retries it).
func TestForwardReadRetriedOnLeaderNotReady(t *testing.T) {
	leaderNode := newFake()
	leaderAPI := New(leaderNode, Options{})
	var reads, writes atomic.Int32
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &writes
		if r.Method == "GET" {
			n = &reads
		}
		if n.Add(1) == 1 {
			writeErrorBody(w, http.StatusServiceUnavailable, &wire.Error{Code: wire.CodeNoLeader, Message: "just elected"})
			return
		}
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{})
	rec, _ := serveWithin(t, h, httptest.NewRequest("GET", "/v1/leases/ls_1", nil), 30*time.Second)
	if rec.Code != http.StatusOK || reads.Load() != 2 {
		t.Fatalf("read answered 503 once: %d %s after %d tries", rec.Code, rec.Body, reads.Load())
	}
	rec, _ = serveWithin(t, h, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)), 30*time.Second)
	wantForwardError(t, "write answered 503", rec, http.StatusServiceUnavailable, "NO_LEADER")
	if writes.Load() != 1 {
		t.Fatalf("write sent %d times", writes.Load())
	}
}
