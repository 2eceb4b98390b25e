package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// fuzzLeader is a "leader" on a raw TCP listener: it reads each request
// and writes whatever answer the test set, then behaves as the mode says.
type fuzzLeader struct {
	ln net.Listener
	mu sync.Mutex
	// answer and mode of the current iteration
	answer []byte
	mode   byte
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Modes of the fuzz leader after (or instead of) its answer.
const (
	leaderClose     = iota // answer, close the connection
	leaderKeepOpen         // answer, keep the connection open, silent
	leaderHalfClose        // answer, close its write side
	leaderSlow             // answer in two halves with a pause between
	leaderSilent           // never answer
	leaderModes
)

func newFuzzLeader(t testing.TB) *fuzzLeader {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &fuzzLeader{ln: ln, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(func() {
		ln.Close()
		l.dropAll()
		l.wg.Wait()
	})
	return l
}

func (l *fuzzLeader) set(answer []byte, mode byte) {
	l.mu.Lock()
	l.answer, l.mode = answer, mode
	l.mu.Unlock()
}

// dropAll cuts every connection the leader holds.
func (l *fuzzLeader) dropAll() {
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
}

func (l *fuzzLeader) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() {
				l.mu.Lock()
				delete(l.conns, c)
				l.mu.Unlock()
				c.Close()
			}()
			l.serve(c)
		}()
	}
}

func (l *fuzzLeader) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
		l.mu.Lock()
		answer, mode := l.answer, l.mode
		l.mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		switch mode {
		case leaderSilent:
			io.Copy(io.Discard, br)
			return
		case leaderSlow:
			c.Write(answer[:len(answer)/2])
			time.Sleep(20 * time.Millisecond) // the slow leader under test
			c.Write(answer[len(answer)/2:])
		default:
			c.Write(answer)
		}
		switch mode {
		case leaderClose:
			return
		case leaderHalfClose:
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, br)
			return
		case leaderKeepOpen:
			io.Copy(io.Discard, br)
			return
		}
	}
}

// leaderStatus is the final status of the leader's answer as a client
// parses it (1xx answers skipped as http.Transport does), or 0 if the
// answer does not parse.
func leaderStatus(answer []byte, method string) int {
	br := bufio.NewReader(bytes.NewReader(answer))
	for range 6 {
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return 0
		}
		if res.StatusCode >= 200 && res.StatusCode <= 599 {
			return res.StatusCode
		}
		if res.StatusCode == http.StatusSwitchingProtocols || res.StatusCode < 100 || res.StatusCode > 599 {
			return 0 // not an answer a follower may pass on
		}
	}
	return 0
}

type forwardFuzzEnv struct {
	leader   *fuzzLeader
	follower *httptest.Server
	client   *http.Client
	panics   *syncBuffer
	timeout  time.Duration
}

// newForwardFuzzEnv: a follower whose forwards time out after 100 ms, or
// after timeout if given.
func newForwardFuzzEnv(t testing.TB, timeout ...time.Duration) *forwardFuzzEnv {
	e := &forwardFuzzEnv{leader: newFuzzLeader(t), panics: &syncBuffer{}, timeout: 100 * time.Millisecond}
	if len(timeout) > 0 {
		e.timeout = timeout[0]
	}
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: e.leader.ln.Addr().String()}, known: true}
	e.follower = httptest.NewUnstartedServer(New(f, Options{ForwardTimeout: e.timeout}))
	e.follower.Config.ErrorLog = log.New(e.panics, "", 0)
	e.follower.Start()
	e.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(func() {
		e.follower.Close()
		e.client.CloseIdleConnections()
	})
	return e
}

// The requests a fuzz iteration may send through the follower.
var forwardFuzzRequests = []struct {
	method, path, body string
	write              bool
}{
	{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5000}`, true},
	{"DELETE", "/v1/leases/ls_1", "", true},
	{"POST", "/v1/leases/ls_1/renew", "", true},
	{"GET", "/v1/leases/ls_1", "", false},
	{"POST", "/v1/validate", `{"key":"k","fencing_token":3}`, false},
}

// knownCodes are the codes a follower may generate for a forward it could
// not complete: NO_LEADER (retryable) or INDETERMINATE (a write that may
// have been applied).
func checkGenerated(t *testing.T, write bool, status int, body []byte) {
	t.Helper()
	var eb struct {
		Error *struct {
			Code    wire.Code `json:"code"`
			Message string    `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Code == "" || eb.Error.Message == "" {
		t.Fatalf("the follower's own answer %d is not a contract error body: %q", status, body)
	}
	switch {
	case eb.Error.Code == wire.CodeNoLeader && status == http.StatusServiceUnavailable:
	case eb.Error.Code == wire.CodeIndeterminate && status == http.StatusGatewayTimeout && write:
	default:
		t.Fatalf("the follower answered a failed forward (write %v) with %d %s", write, status, body)
	}
}

func (e *forwardFuzzEnv) run(t *testing.T, which, mode byte, answer []byte) {
	rq := forwardFuzzRequests[int(which)%len(forwardFuzzRequests)]
	mode %= leaderModes
	e.leader.set(answer, mode)
	defer e.leader.dropAll()
	var body io.Reader
	if rq.body != "" {
		body = strings.NewReader(rq.body)
	}
	req, err := http.NewRequest(rq.method, e.follower.URL+rq.path, body)
	if err != nil {
		t.Fatal(err)
	}
	// The forward's bound, with a generous margin for a loaded machine.
	bound := e.timeout + 10*time.Second
	type result struct {
		res  *http.Response
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		res.Body.Close()
		done <- result{res: res, body: b, err: err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(bound):
		t.Fatalf("%s %s: no answer within %v", rq.method, rq.path, bound)
	}
	if p := e.panics.String(); strings.Contains(p, "panic") {
		t.Fatalf("the follower panicked: %s", p)
	}
	ls := leaderStatus(answer, rq.method)
	passed := r.res != nil && ls != 0 && r.res.StatusCode == ls
	if r.res == nil || r.err != nil {
		// The connection to the client was cut: acceptable only when the
		// leader's answer was passing through and was cut itself.
		if ls < 200 || ls > 599 || r.res != nil && !passed {
			t.Fatalf("%s %s: %v (leader status %d, response %v)", rq.method, rq.path, r.err, ls, r.res != nil)
		}
		return
	}
	if c := r.res.StatusCode; c < 200 || c > 599 {
		t.Fatalf("%s %s: status %d to the client", rq.method, rq.path, c)
	}
	if passed {
		return
	}
	checkGenerated(t, rq.write, r.res.StatusCode, r.body)
}

// FuzzForwardLeaderAnswer plays a malicious leader to a follower's
// forwards: its answer is any bytes (bad status lines and codes, broken
// headers, truncated, oversized or badly chunked bodies), cut at any
// point or never finished. The follower never panics, answers within the
// forward bound, passes on only what the leader said (a write is never a
// success the leader did not send), with valid status codes, and what it
// says itself is a contract error: NO_LEADER, or INDETERMINATE for a write.
func FuzzForwardLeaderAnswer(f *testing.F) {
	uncheckedExchanges(f) // the fake leader's answers pass through
	ok := "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"lease_id\":\"x\"}\n"
	for _, s := range []struct {
		which, mode byte
		answer      string
	}{
		{0, leaderClose, ok},
		{0, leaderKeepOpen, ok},
		{3, leaderSlow, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
		{0, leaderClose, "HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"lease"},
		{0, leaderKeepOpen, "HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"lease"},
		{0, leaderClose, "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"},
		{3, leaderClose, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"},
		{0, leaderClose, "HTTP/1.1 099 Weird\r\nContent-Length: 0\r\n\r\n"},
		{0, leaderClose, "HTTP/1.1 999 Weird\r\nContent-Length: 0\r\n\r\n"},
		{3, leaderClose, "HTTP/1.1 600 Weird\r\nContent-Length: 0\r\n\r\n"},
		{1, leaderClose, "HTTP/1.1 000 Zero\r\n\r\n"},
		{0, leaderClose, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"},
		{0, leaderClose, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"},
		{0, leaderClose, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"},
		{0, leaderClose, "garbage\r\n\r\n"},
		{4, leaderClose, "HTTP/1.1 2001 OK\r\n\r\n"},
		{0, leaderHalfClose, "HTTP/1.1 201"},
		{3, leaderSilent, ""},
		{0, leaderSilent, ""},
		{1, leaderClose, ""},
		{0, leaderClose, "HTTP/1.1 201 Created\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n"},
		{3, leaderClose, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"},
		{4, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"},
		{2, leaderClose, "HTTP/1.0 204 No Content\r\n\r\n"},
		{0, leaderClose, "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcde"},
	} {
		f.Add(s.which, s.mode, []byte(s.answer))
	}
	e := newForwardFuzzEnv(f)
	f.Fuzz(func(t *testing.T, which, mode byte, answer []byte) {
		e.run(t, which, mode, answer)
	})
}

// controlFollower is a follower of the fuzz leader as the control lease
// sees it: every operation goes to the leader (its local methods are
// never called), over a "node-to-node stream" that is plain TCP to the
// fuzz leader.
type controlFollower struct {
	ControlNode
	addr string
}

func (c *controlFollower) Leader() (node.LeaderInfo, bool) {
	return node.LeaderInfo{ID: "l1", RaftAddr: c.addr}, true
}

func (c *controlFollower) DialPeer(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

func (c *controlFollower) ServePeer(http.Handler) {}

func (c *controlFollower) NodeID() string { return "follower" }

// FuzzControlForwardAnswer plays a malicious leader to a follower's
// control operations (a socket's acquire, heartbeat, release or status,
// sent to the leader's node-to-node /v1/control/forward): the follower never panics,
// ends within its deadline, reports success only for a 200 that holds a
// state (an acquire's with its lease), and otherwise either the leader's
// own error or NO_LEADER / INDETERMINATE, never a code the contract does
// not know for an answer it could not read.
func FuzzControlForwardAnswer(f *testing.F) {
	uncheckedExchanges(f) // the fake leader's answers pass through
	ok := `{"active":true,"leaseId":"cl_1","leaseToken":"tok","scope":"global"}`
	for _, s := range []struct {
		which, mode byte
		answer      string
	}{
		{0, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: " + fmt.Sprint(len(ok)) + "\r\n\r\n" + ok},
		{0, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnull"},
		{0, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
		{1, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n<html"},
		{2, leaderClose, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\n<html"},
		{0, leaderClose, "HTTP/1.1 409 Conflict\r\nContent-Length: 67\r\n\r\n{\"error\":{\"code\":\"CONTROL_LOCKED\",\"message\":\"x\",\"scope\":\"global\"}}"},
		{0, leaderClose, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"active\""},
		{0, leaderKeepOpen, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"active\""},
		{3, leaderSilent, ""},
		{0, leaderClose, "HTTP/1.1 099 X\r\n\r\n"},
		{0, leaderClose, "garbage"},
	} {
		f.Add(s.which, s.mode, []byte(s.answer))
	}
	leader := newFuzzLeader(f)
	cn := &controlFollower{addr: leader.ln.Addr().String()}
	ctl := NewControl(cn, ControlOptions{})
	f.Cleanup(ctl.client.CloseIdleConnections)
	ops := []*controlOp{
		{Op: "acquire", Acquire: &node.ControlAcquireRequest{Holder: "ws_1"}},
		{Op: "heartbeat", Holder: "ws_1", LeaseID: "cl_1", Token: "tok"},
		{Op: "release", Holder: "ws_1", LeaseID: "cl_1", Token: "tok", Reason: "x"},
		{Op: "status"},
	}
	f.Fuzz(func(t *testing.T, which, mode byte, answer []byte) {
		op := ops[int(which)%len(ops)]
		leader.set(answer, mode%leaderModes)
		defer leader.dropAll()
		const deadline = 100 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		type result struct {
			st  *node.ControlState
			err error
		}
		done := make(chan result, 1)
		go func() {
			st, err := ctl.do(ctx, nil, op)
			done <- result{st, err}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(deadline + 10*time.Second):
			t.Fatalf("%s: no result within its deadline", op.Op)
		}
		if r.err == nil {
			if r.st == nil || leaderStatus(answer, "POST") != http.StatusOK {
				t.Fatalf("%s: success %+v from a leader's answer that is not a 200", op.Op, r.st)
			}
			if op.Op == "acquire" && (r.st.LeaseID == "" || r.st.LeaseToken == "") {
				t.Fatalf("acquire: success without a lease: %+v", r.st)
			}
			return
		}
		code := wire.ErrorCode(r.err)
		switch {
		case code == wire.CodeNoLeader, code == wire.CodeIndeterminate && op.Op != "status":
		case code == wire.CodeInternal || code == "":
			t.Fatalf("%s: %v (%s) for the leader's answer %q", op.Op, r.err, code, answer)
		default:
			// The leader's own error: it must have said so.
			if !bytes.Contains(answer, []byte(code)) {
				t.Fatalf("%s: %v (%s), which the leader did not say", op.Op, r.err, code)
			}
		}
	})
}

// TestForwardLeaderHugeHeader: a leader whose answer head is over
// http.DefaultMaxHeaderBytes is not passed on (the transport's default
// limit was 10 MB per forward): a write is INDETERMINATE, a read NO_LEADER.
func TestForwardLeaderHugeHeader(t *testing.T) {
	// The head is refused as it is read, not by the forward's timeout: a
	// 100 ms one ran out on a loaded machine before the request was even
	// written (NO_LEADER, rightly, where the test wants INDETERMINATE).
	e := newForwardFuzzEnv(t, 30*time.Second)
	answer := []byte("HTTP/1.1 201 Created\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\nContent-Length: 2\r\n\r\n{}")
	for _, which := range []byte{0, 3} {
		rq := forwardFuzzRequests[which]
		e.leader.set(answer, leaderClose)
		var body io.Reader
		if rq.body != "" {
			body = strings.NewReader(rq.body)
		}
		req, _ := http.NewRequest(rq.method, e.follower.URL+rq.path, body)
		res, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		want := http.StatusGatewayTimeout
		if !rq.write {
			want = http.StatusServiceUnavailable
		}
		if res.StatusCode != want || len(res.Header.Get("X-Big")) != 0 {
			t.Fatalf("%s %s: %d (X-Big %d bytes) %s, want %d", rq.method, rq.path, res.StatusCode, len(res.Header.Get("X-Big")), b, want)
		}
		checkGenerated(t, rq.write, res.StatusCode, b)
		e.leader.dropAll()
	}
}
