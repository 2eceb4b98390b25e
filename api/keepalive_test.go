package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// realNodeAPI starts an in-memory single node and serves its API.
func realNodeAPI(t *testing.T, opts Options) (*node.Node, *httptest.Server) {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h := New(FromNode(n), opts)
	waitFor(t, "the node to be ready", func() bool { return do(t, h, "GET", "/readyz", "").Code == 200 })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return n, srv
}

// kaStream is a raw keep-alive stream: lines go out on w, answers come in
// on answers.
type kaStream struct {
	resp *http.Response
	w    *io.PipeWriter
	br   *bufio.Reader
}

func openKeepAlive(t *testing.T, url, token string) (*kaStream, *http.Response) {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/keepalive", pr)
	req.ContentLength = -1
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close(); pw.Close() })
	if resp.StatusCode != 200 {
		return nil, resp
	}
	return &kaStream{resp: resp, w: pw, br: bufio.NewReader(resp.Body)}, resp
}

func (s *kaStream) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(s.w, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (s *kaStream) next(t *testing.T) wire.KeepAliveAnswer {
	t.Helper()
	line, err := s.br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	var a wire.KeepAliveAnswer
	if err := json.Unmarshal(line, &a); err != nil {
		t.Fatalf("answer %q: %v", line, err)
	}
	return a
}

func acquireReal(t *testing.T, h http.Handler, key string) *wire.Lease {
	t.Helper()
	rec := do(t, h, "POST", "/v1/leases", `{"key":"`+key+`","holder":"w1","ttl_ms":5000}`)
	if rec.Code != 201 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	var l wire.Lease
	jsonOf(t, rec, &l)
	return &l
}

// TestKeepAliveStream: renewals on one stream are answered each with the
// outcome (and error code) the single renew would give; a bad line gets an
// error and the stream goes on; closing the body ends the answer.
func TestKeepAliveStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, srv := realNodeAPI(t, Options{})
	h := srv.Config.Handler
	l := acquireReal(t, h, "ka/1")
	gone := acquireReal(t, h, "ka/2")
	if rec := do(t, h, "DELETE", "/v1/leases/"+gone.LeaseID, "", "X-Lease-Token", gone.Token); rec.Code != 200 {
		t.Fatalf("release: %d", rec.Code)
	}
	s, _ := openKeepAlive(t, srv.URL, "")

	s.send(t, fmt.Sprintf(`{"id":1,"lease_id":%q,"token":%q}`, l.LeaseID, l.Token))
	if a := s.next(t); a.ID != 1 || !a.OK || a.LeaseID != l.LeaseID || a.FencingToken != l.FencingToken || a.RenewalCount != 1 || a.ExpiresAt == nil {
		t.Fatalf("renewal 1: %+v", a)
	}
	// The renewal was committed before it was answered: a new TTL is
	// visible at once.
	s.send(t, fmt.Sprintf(`{"id":2,"lease_id":%q,"token":%q,"ttl_ms":60000}`, l.LeaseID, l.Token))
	if a := s.next(t); a.ID != 2 || !a.OK || a.TTLMS != 60000 || a.RenewalCount != 2 {
		t.Fatalf("renewal 2: %+v", a)
	}
	var got wire.Lease
	jsonOf(t, do(t, h, "GET", "/v1/leases/"+l.LeaseID, ""), &got)
	if got.TTLMS != 60000 || got.RenewalCount != 2 || got.RemainingMS <= 5000 {
		t.Fatalf("after the answer, GET shows %+v", got)
	}

	// Errors: the same statuses and codes as POST /v1/leases/:id/renew.
	for i, tt := range []struct {
		id, token string
	}{
		{l.LeaseID, "wrong"},
		{"ls_00000000", l.Token},
		{gone.LeaseID, gone.Token},
	} {
		single := do(t, h, "POST", "/v1/leases/"+tt.id+"/renew", "", "X-Lease-Token", tt.token)
		want := errorOf(t, single)
		id := 10 + i
		s.send(t, fmt.Sprintf(`{"id":%d,"lease_id":%q,"token":%q}`, id, tt.id, tt.token))
		a := s.next(t)
		if a.ID != uint64(id) || a.OK || a.Error == nil || a.Error.Code != want.Code || a.Status != single.Code {
			t.Errorf("renewal %d: %+v (error %+v), want %d %s", id, a, a.Error, single.Code, want.Code)
		}
	}

	// A line that is not a renewal is answered with id 0; the stream goes
	// on. A missing token names the field.
	s.send(t, `{"id":20,"lease_id":`)
	if a := s.next(t); a.ID != 0 || a.Error == nil || a.Error.Code != wire.CodeInvalidArgument || a.Status != 400 {
		t.Fatalf("malformed line: %+v", a)
	}
	s.send(t, `{"id":21,"lease_id":"`+l.LeaseID+`"}`)
	if a := s.next(t); a.ID != 21 || a.Error == nil || a.Error.Field != "token" {
		t.Fatalf("missing token: %+v", a)
	}
	s.send(t, "") // an empty line keeps the stream open and is not answered
	s.send(t, fmt.Sprintf(`{"id":22,"lease_id":%q,"token":%q}`, l.LeaseID, l.Token))
	if a := s.next(t); a.ID != 22 || !a.OK || a.RenewalCount != 3 {
		t.Fatalf("renewal after the bad lines: %+v", a)
	}

	// The client ends its side: the answer ends.
	s.w.Close()
	if rest, err := io.ReadAll(s.br); err != nil || len(rest) != 0 {
		t.Fatalf("after the body ended: %q, %v", rest, err)
	}
}

// TestKeepAliveLineTooLong: an oversized line gets an error answer and the
// stream ends.
func TestKeepAliveLineTooLong(t *testing.T) {
	srv := httptest.NewServer(New(newFake(), Options{}))
	t.Cleanup(srv.Close)
	s, _ := openKeepAlive(t, srv.URL, "")
	s.send(t, `{"id":1,"lease_id":"`+strings.Repeat("x", KeepAliveMaxLine)+`","token":"t"}`)
	if a := s.next(t); a.Error == nil || a.Error.Code != wire.CodeInvalidArgument || !strings.Contains(a.Error.Message, "exceeds") {
		t.Fatalf("long line: %+v", a)
	}
	if _, err := s.br.ReadBytes('\n'); err != io.EOF {
		t.Fatalf("the stream did not end: %v", err)
	}
}

// TestKeepAliveAuth: the stream needs the renew's scope, write.
func TestKeepAliveAuth(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(New(f, Options{Tokens: testTokens(t)}))
	t.Cleanup(srv.Close) // after the streams' own cleanups
	for _, tt := range []struct {
		token  string
		status int
	}{{"", 401}, {readToken, 403}, {"nope-0123456789", 401}} {
		if _, resp := openKeepAlive(t, srv.URL, tt.token); resp.StatusCode != tt.status {
			t.Errorf("token %q: %d, want %d", tt.token, resp.StatusCode, tt.status)
		}
	}
	s, _ := openKeepAlive(t, srv.URL, writeToken)
	if s == nil {
		t.Fatal("the write token was refused")
	}
	s.send(t, `{"id":7,"lease_id":"ls_1","token":"t"}`)
	if a := s.next(t); a.ID != 7 || !a.OK {
		t.Fatalf("renewal: %+v", a)
	}
	if c := f.only(t, "RenewMany").args[0].([]wire.RenewRequest); len(c) != 1 || c[0].LeaseID != "ls_1" || c[0].Token != "t" {
		t.Fatalf("renew call %+v", c)
	}
}

// TestKeepAliveUnit: the renewals of lines read in together go to the node
// as one unit (one RenewMany, at most keepAliveUnitMax of them) and are
// answered in their order, each with its own outcome; a line that is not
// a renewal among them is answered at once, on its own, and leaves the
// others be.
func TestKeepAliveUnit(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	lines := []string{
		`{"id":1,"lease_id":"ls_1","token":"t"}`,
		`not json`,
		`{"id":3,"lease_id":"ls_3"}`,
		`{"id":4,"lease_id":"ls_4","token":"bad"}`,
		`{"id":5,"lease_id":"ls_5","token":"t","ttl_ms":3000}`,
	}
	for i := 6; i < 6+keepAliveUnitMax; i++ {
		lines = append(lines, fmt.Sprintf(`{"id":%d,"lease_id":"ls_%d","token":"t"}`, i, i))
	}
	// The whole body is there at once (and fits the reader's buffer):
	// every line is read in with the first.
	rec := do(t, h, "POST", "/v1/keepalive", strings.Join(lines, "\n")+"\n")
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	var got []wire.KeepAliveAnswer
	for _, line := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
		var a wire.KeepAliveAnswer
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		got = append(got, a)
	}
	if len(got) != len(lines) {
		t.Fatalf("%d answers to %d lines", len(got), len(lines))
	}
	if a := got[0]; a.ID != 0 || a.Error == nil || a.Error.Code != wire.CodeInvalidArgument {
		t.Errorf("the line that is not JSON: %+v", a)
	}
	if a := got[1]; a.ID != 3 || a.Error == nil || a.Error.Field != "token" {
		t.Errorf("the line without a token: %+v", a)
	}
	// Each unit's answers, in its order and together (the writer gets a
	// unit's answers at once): 1, 4, 5, 6, ..., 66 and 67, 68, 69. The two
	// units run in goroutines of their own: either may be answered first.
	first := []uint64{1, 4, 5}
	for i := 6; i < 6+keepAliveUnitMax-3; i++ {
		first = append(first, uint64(i))
	}
	var second []uint64
	for i := 6 + keepAliveUnitMax - 3; i < 6+keepAliveUnitMax; i++ {
		second = append(second, uint64(i))
	}
	want := append(append([]uint64(nil), first...), second...)
	if got[2].ID != 1 {
		want = append(append([]uint64(nil), second...), first...)
	}
	for i, id := range want {
		a := got[2+i]
		if a.ID != id || a.LeaseID != fmt.Sprintf("ls_%d", id) {
			t.Fatalf("answer %d: %+v, want id %d", 2+i, a, id)
		}
		if ok := id != 4; a.OK != ok || (!ok && (a.Error == nil || a.Error.Code != wire.CodeLeaseTokenInvalid)) {
			t.Errorf("answer to %d: %+v (%+v)", id, a, a.Error)
		}
	}
	var sizes []int
	for _, c := range f.called() {
		if c.method != "RenewMany" {
			t.Fatalf("call %s", c.method)
		}
		reqs := c.args[0].([]wire.RenewRequest)
		sizes = append(sizes, len(reqs))
		if reqs[0].LeaseID == "ls_1" && (reqs[1].LeaseID != "ls_4" || reqs[2].TTLMS != 3000) {
			t.Errorf("the first unit: %+v", reqs[:3])
		}
	}
	slices.Sort(sizes)
	if fmt.Sprint(sizes) != fmt.Sprint([]int{3, keepAliveUnitMax}) {
		t.Errorf("units of %v renewals, want %d and 3", sizes, keepAliveUnitMax)
	}
}

// TestRenewStreamConcurrent: many goroutines share one client stream; every
// renewal is answered to its own caller and committed (the renewal counts
// add up).
func TestRenewStreamConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, srv := realNodeAPI(t, Options{})
	h := srv.Config.Handler
	const leases, perLease, goroutinesPerLease = 4, 30, 4
	ls := make([]*wire.Lease, leases)
	for i := range ls {
		ls[i] = acquireReal(t, h, fmt.Sprintf("ka/c%d", i))
	}
	c, err := client.New([]string{srv.URL}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rs, err := c.KeepAliveStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var wg sync.WaitGroup
	errs := make(chan error, leases*goroutinesPerLease)
	for i := range leases * goroutinesPerLease {
		l := ls[i%leases]
		wg.Go(func() {
			for range perLease {
				a, err := rs.Renew(ctx, l.LeaseID, l.Token, 0)
				if err != nil {
					errs <- err
					return
				}
				if a.LeaseID != l.LeaseID || !a.OK {
					errs <- fmt.Errorf("answer for another lease: %+v", a)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, l := range ls {
		var got wire.Lease
		jsonOf(t, do(t, h, "GET", "/v1/leases/"+l.LeaseID, ""), &got)
		if got.RenewalCount != perLease*goroutinesPerLease {
			t.Errorf("%s renewed %d times, want %d", l.LeaseID, got.RenewalCount, perLease*goroutinesPerLease)
		}
	}
	// Errors come back as from Client.Renew.
	_, err = rs.Renew(ctx, ls[0].LeaseID, "wrong", 0)
	if client.ErrorCode(err) != wire.CodeLeaseTokenInvalid || client.StatusCode(err) != 403 {
		t.Fatalf("bad token: %v (status %d)", err, client.StatusCode(err))
	}
	rs.Close()
	if _, err := rs.Renew(ctx, ls[0].LeaseID, ls[0].Token, 0); err != client.ErrRenewStreamClosed {
		t.Fatalf("after Close: %v", err)
	}
}

// TestRenewStreamLostConnection: a renewal in flight when the connection is
// lost fails INDETERMINATE; the next renewal opens a new stream.
func TestRenewStreamLostConnection(t *testing.T) {
	f := newFake()
	api := New(f, Options{})
	var mu sync.Mutex
	first := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		drop := first && r.URL.Path == "/v1/keepalive"
		first = first && !drop
		mu.Unlock()
		if !drop {
			api.ServeHTTP(w, r)
			return
		}
		// Accept the stream, read one renewal, then drop the connection.
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.WriteHeader(200)
		_ = rc.Flush()
		_, _ = bufio.NewReader(r.Body).ReadBytes('\n')
		if conn, _, err := rc.Hijack(); err == nil {
			conn.Close()
		}
	}))
	defer srv.Close()
	c, _ := client.New([]string{srv.URL}, client.Options{})
	ctx := context.Background()
	rs, err := c.KeepAliveStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	_, err = rs.Renew(ctx, "ls_1", "t", 0)
	if client.ErrorCode(err) != wire.CodeIndeterminate || !strings.Contains(err.Error(), "may or may not") {
		t.Fatalf("renewal on a lost stream: %v", err)
	}
	// The next one goes out on a new stream.
	var a *wire.KeepAliveAnswer
	for i := 0; ; i++ {
		a, err = rs.Renew(ctx, "ls_2", "t", 0)
		if err == nil || i > 100 {
			break
		}
	}
	if err != nil || !a.OK || a.LeaseID != "ls_2" {
		t.Fatalf("after reconnecting: %+v, %v", a, err)
	}
}

// TestKeepAliveThroughFollower: a follower forwards the stream to the
// leader, both ways at once.
func TestKeepAliveThroughFollower(t *testing.T) {
	leaderNode := newFake()
	leader := httptest.NewServer(New(leaderNode, Options{}))
	defer leader.Close()
	local := newFake()
	f := &followerFake{fakeNode: local, leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	follower := httptest.NewServer(New(f, Options{}))
	defer follower.Close()

	c, _ := client.New([]string{follower.URL}, client.Options{})
	ctx := context.Background()
	rs, err := c.KeepAliveStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for i := range 5 {
		id := fmt.Sprintf("ls_%d", i)
		a, err := rs.Renew(ctx, id, "t", 0)
		if err != nil || !a.OK || a.LeaseID != id {
			t.Fatalf("renewal %d through the follower: %+v, %v", i, a, err)
		}
	}
	if n := len(leaderNode.called()); n != 5 || len(local.called()) != 0 {
		t.Fatalf("leader saw %d renewals, follower %v", n, local.called())
	}
}

// TestKeepAliveEndsOnShutdown: a stream ends when its request context is
// cancelled (the server's shutdown), though the client keeps its side open.
func TestKeepAliveEndsOnShutdown(t *testing.T) {
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewUnstartedServer(New(newFake(), Options{}))
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Start()
	t.Cleanup(srv.Close)
	s, _ := openKeepAlive(t, srv.URL, "")
	s.send(t, `{"id":1,"lease_id":"ls_1","token":"t"}`)
	if a := s.next(t); a.ID != 1 || !a.OK {
		t.Fatalf("renewal: %+v", a)
	}
	cancel()
	if _, err := s.br.ReadBytes('\n'); err != io.EOF {
		t.Fatalf("the stream did not end: %v", err)
	}
}

// TestKeepAliveBurstAfterIdle: a stream idle for longer than the write
// timeout, then sent a burst whose answers overflow the write buffer, gets
// every answer: each write has the whole timeout, not what was left of the
// deadline set at the last flush.
func TestKeepAliveBurstAfterIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	// A second: a busy machine may keep the reader from reading for a
	// while, and a write must not time out on that (it did at 100 ms).
	const timeout, burst = time.Second, 800
	_, srv := realNodeAPI(t, Options{WriteTimeout: timeout})
	l := acquireReal(t, srv.Config.Handler, "ka/burst")
	s, _ := openKeepAlive(t, srv.URL, "")
	line := func(id int) string { return fmt.Sprintf(`{"id":%d,"lease_id":%q,"token":%q}`, id, l.LeaseID, l.Token) }
	s.send(t, line(1))
	if a := s.next(t); !a.OK {
		t.Fatalf("first renewal: %+v", a)
	}
	// Idle past the write timeout (the deadline of the last flush passes).
	time.Sleep(timeout + timeout/2) // the idle time under test
	var b strings.Builder
	for i := 2; i < 2+burst; i++ {
		b.WriteString(line(i) + "\n")
	}
	go io.WriteString(s.w, b.String())
	for i := 0; i < burst; i++ {
		line, err := s.br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("answer %d of %d: %v (the stream ended)", i+1, burst, err)
		}
		var a wire.KeepAliveAnswer
		if err := json.Unmarshal(line, &a); err != nil || !a.OK {
			t.Fatalf("answer %d: %q %v", i+1, line, err)
		}
	}
}

// TestKeepAliveUnitFailureLoggedOnce: a unit's write that fails unexpectedly
// is every renewal's error, answered for each, and logged once.
func TestKeepAliveUnitFailureLoggedOnce(t *testing.T) {
	f := newFake()
	f.err = errors.New("disk on fire")
	var logs bytes.Buffer
	h := New(f, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var lines []string
	for i := 1; i <= 5; i++ {
		lines = append(lines, fmt.Sprintf(`{"id":%d,"lease_id":"ls_%d","token":"t"}`, i, i))
	}
	rec := do(t, h, "POST", "/v1/keepalive", strings.Join(lines, "\n")+"\n")
	answers := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
	if len(answers) != len(lines) {
		t.Fatalf("%d answers to %d lines: %s", len(answers), len(lines), rec.Body)
	}
	for _, line := range answers {
		var a wire.KeepAliveAnswer
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		if a.OK || a.Error == nil || a.Error.Code != wire.CodeInternal {
			t.Errorf("answer %+v, want INTERNAL", a)
		}
	}
	if n := strings.Count(logs.String(), "disk on fire"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, logs.String())
	}
}
