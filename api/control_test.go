package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// syncBuffer is a log sink shared by the node and the API.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// controlEnv is one in-memory node behind an httptest server.
type controlEnv struct {
	n    *node.Node
	srv  *httptest.Server
	logs *syncBuffer
}

func newControlEnv(t *testing.T, opts Options) *controlEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a node")
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	cfg.Logger = logger
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger = logger
	srv := httptest.NewServer(New(FromNode(n), opts))
	t.Cleanup(func() {
		srv.Close()
		n.Close()
	})
	e := &controlEnv{n: n, srv: srv, logs: logs}
	pollUntil(t, 20*time.Second, "the node to be ready", func() bool { return n.ReadyErr() == nil })
	return e
}

// pollUntil polls cond until it holds or d passes.
func pollUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for !cond() {
		select {
		case <-poll.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// wsMsg is any server message, decoded loosely.
type wsMsg struct {
	Type      string          `json:"type"`
	RequestID string          `json:"requestId"`
	Event     string          `json:"event"`
	Success   bool            `json:"success"`
	Data      json.RawMessage `json:"data"`
	Error     *controlErr     `json:"error"`
	raw       string
}

func (m wsMsg) state(t testing.TB) node.ControlState {
	t.Helper()
	var st node.ControlState
	if err := json.Unmarshal(m.Data, &st); err != nil {
		t.Fatalf("data of %s: %v", m.raw, err)
	}
	return st
}

// wsClient is a test client of the control socket; it records every
// message it receives.
type wsClient struct {
	t    testing.TB
	c    *websocket.Conn
	ch   chan wsMsg
	done chan struct{}
	mu   sync.Mutex
	all  []string
	err  error
	seq  int
}

func dialControl(t testing.TB, base string, hdr http.Header) *wsClient {
	t.Helper()
	return dialControlURL(t, "ws"+strings.TrimPrefix(base, "http")+"/v1/control/ws", hdr)
}

func dialControlURL(t testing.TB, u string, hdr http.Header) *wsClient {
	t.Helper()
	c, err := tryDialURL(u, hdr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	w := &wsClient{t: t, c: c, ch: make(chan wsMsg, 1024), done: make(chan struct{})}
	go w.read()
	t.Cleanup(func() { c.CloseNow() })
	return w
}

func tryDialControl(base string, hdr http.Header) (*websocket.Conn, error) {
	return tryDialURL("ws"+strings.TrimPrefix(base, "http")+"/v1/control/ws", hdr)
}

func tryDialURL(u string, hdr http.Header) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil && resp != nil {
		b, _ := io.ReadAll(resp.Body)
		return nil, &dialError{status: resp.StatusCode, body: string(b), err: err}
	}
	return c, err
}

type dialError struct {
	status int
	body   string
	err    error
}

func (e *dialError) Error() string { return e.err.Error() + ": " + e.body }

func (w *wsClient) read() {
	defer close(w.done)
	for {
		_, b, err := w.c.Read(context.Background())
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		var m wsMsg
		if err := json.Unmarshal(b, &m); err != nil {
			w.t.Errorf("undecodable message %s: %v", b, err)
			continue
		}
		m.raw = string(b)
		w.mu.Lock()
		w.all = append(w.all, m.raw)
		w.mu.Unlock()
		w.ch <- m
	}
}

func (w *wsClient) send(v map[string]any) string {
	w.t.Helper()
	w.seq++
	id := "req-" + string(rune('a'+w.seq%26)) + time.Now().Format("150405.000000")
	if _, ok := v["requestId"]; !ok {
		v["requestId"] = id
	} else {
		id, _ = v["requestId"].(string)
	}
	b, _ := json.Marshal(v)
	w.sendRaw(string(b))
	return id
}

func (w *wsClient) sendRaw(s string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
		w.t.Fatalf("write: %v", err)
	}
}

// next returns the first message matching pred, skipping others, within d.
func (w *wsClient) next(d time.Duration, what string, pred func(wsMsg) bool) wsMsg {
	w.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m := <-w.ch:
			if pred(m) {
				return m
			}
		case <-w.done:
			w.t.Fatalf("socket closed (%v) while waiting for %s", w.err, what)
		case <-timer.C:
			w.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// reply waits for the answer to requestID.
func (w *wsClient) reply(id string) wsMsg {
	w.t.Helper()
	return w.next(20*time.Second, "the reply to "+id, func(m wsMsg) bool { return m.RequestID == id })
}

// registered waits until the server serves this socket: the handshake
// completes before the server adds the socket to those its broadcasts
// reach, so a broadcast right after the dial may miss it; a status request
// answered proves it is there.
func (w *wsClient) registered() *wsClient {
	w.t.Helper()
	w.reply(w.send(map[string]any{"type": "control.status"}))
	return w
}

func (w *wsClient) changed(event string) wsMsg {
	w.t.Helper()
	return w.next(20*time.Second, "control.stateChanged "+event, func(m wsMsg) bool {
		return m.Type == "control.stateChanged" && m.Event == event
	})
}

func (w *wsClient) transcript() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.all, "\n")
}

func wantWSError(t testing.TB, m wsMsg, code wire.Code) *controlErr {
	t.Helper()
	if m.Type != "error" || m.Success || m.Error == nil || m.Error.Code != code || m.Error.Message == "" {
		t.Fatalf("want error %s, got %s", code, m.raw)
	}
	return m.Error
}

func acquire(t testing.TB, w *wsClient, name string, extra ...any) node.ControlState {
	t.Helper()
	req := map[string]any{"type": "control.acquire", "clientName": name,
		"clientInstanceId": "6f0d84a3-8f49-4da8-8c70-0b8f6db5a870", "scope": "global"}
	for i := 0; i+1 < len(extra); i += 2 {
		req[extra[i].(string)] = extra[i+1]
	}
	m := w.reply(w.send(req))
	if m.Type != "control.acquired" || !m.Success {
		t.Fatalf("acquire: %s", m.raw)
	}
	return m.state(t)
}

var controlIDRe = regexp.MustCompile(`^cl_[0-9a-f]+$`)

// checkToken checks the control protocol's token format: base64url without padding of
// at least 16 bytes.
func checkToken(t testing.TB, tok string) {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || strings.ContainsAny(tok, "=+/") {
		t.Fatalf("token %q is not unpadded base64url: %v", tok, err)
	}
	if len(b) < 16 {
		t.Fatalf("token has %d bytes of entropy, want >= 16", len(b))
	}
}

func restDo(t testing.TB, method, url, body string, hdr ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func restStatus(t testing.TB, base string) node.ControlState {
	t.Helper()
	code, b := restDo(t, "GET", base+"/v1/control/status", "")
	if code != 200 {
		t.Fatalf("status: %d %s", code, b)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["leaseToken"]; ok {
		t.Fatalf("status carries leaseToken: %s", b)
	}
	var st node.ControlState
	json.Unmarshal(b, &st)
	return st
}

// restError decodes the control protocol's REST error schema.
func restError(t testing.TB, code int, b []byte, status int, want wire.Code) controlErr {
	t.Helper()
	var body struct {
		Success *bool      `json:"success"`
		Error   controlErr `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("not an error body: %s", b)
	}
	if code != status || body.Error.Code != want || body.Success == nil || *body.Success {
		t.Fatalf("got %d %s, want %d %s", code, b, status, want)
	}
	return body.Error
}

// TestControlProtocol runs the whole protocol on one node: acquire with the
// control protocol's defaults, locked for a second client, heartbeat, status, re-acquire
// refresh, wrong credentials, release, and the broadcasts in between.
func TestControlProtocol(t *testing.T) {
	env := newControlEnv(t, Options{})
	a := dialControl(t, env.srv.URL, nil)
	b := dialControl(t, env.srv.URL, nil).registered()

	// Nobody holds it: status is inactive with the defaults.
	st := restStatus(t, env.srv.URL)
	if st.Active || st.Scope != "global" || st.TTLMS != 5000 || st.HeartbeatIntervalMS != 1000 || st.TakeoverAllowed {
		t.Fatalf("idle status = %+v", st)
	}

	got := acquire(t, a, "K1 Composer")
	if !got.Active || got.Scope != "global" || got.TTLMS != 5000 || got.HeartbeatIntervalMS != 1000 ||
		got.TakeoverAllowed || got.RemainingMS == 0 || got.RemainingMS > 5000 || got.OwnerWSClientID == 0 ||
		got.OwnerClientName != "K1 Composer" || got.OwnerInstanceID != "6f0d84a3-8f49-4da8-8c70-0b8f6db5a870" {
		t.Fatalf("acquired = %+v", got)
	}
	if !controlIDRe.MatchString(got.LeaseID) {
		t.Fatalf("leaseId %q is not cl_<hex>", got.LeaseID)
	}
	if got.ExpiresAtMS-got.AcquiredAtMS != 5000 {
		t.Errorf("expiresAtMs - acquiredAtMs = %d, want 5000", got.ExpiresAtMS-got.AcquiredAtMS)
	}
	checkToken(t, got.LeaseToken)
	ch := b.changed("acquired").state(t)
	if ch.LeaseID != got.LeaseID || !ch.Active || ch.OwnerClientName != "K1 Composer" || ch.LeaseToken != "" {
		t.Fatalf("stateChanged acquired = %+v", ch)
	}

	// A second client is locked out, with the owner's details.
	e := wantWSError(t, b.reply(b.send(map[string]any{"type": "control.acquire", "clientName": "other"})), wire.CodeControlLocked)
	if e.OwnerClientName == nil || *e.OwnerClientName != "K1 Composer" || e.RemainingMS == nil || *e.RemainingMS <= 0 || e.Scope != "global" {
		t.Fatalf("CONTROL_LOCKED details = %+v", e)
	}
	// Another connection cannot use the owner's credentials either.
	wantWSError(t, b.reply(b.send(map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken})), wire.CodeControlLocked)

	// Heartbeat: ack, and a broadcast to the others. Once the countdown
	// has moved by 500 ms, the heartbeat moves the expiry (a tick: the
	// countdown in the answer is rendered after the write, a loaded
	// machine may let ticks pass in between) by at least as much.
	pollUntil(t, 10*time.Second, "the countdown to move", func() bool { return restStatus(t, env.srv.URL).RemainingMS < 4500 })
	m := a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken}))
	if m.Type != "control.heartbeatAck" || !m.Success {
		t.Fatalf("heartbeat: %s", m.raw)
	}
	var ack struct {
		LeaseID     string `json:"leaseId"`
		TTLMS       uint32 `json:"ttlMs"`
		RemainingMS uint32 `json:"remainingMs"`
		ExpiresAtMS uint32 `json:"expiresAtMs"`
	}
	json.Unmarshal(m.Data, &ack)
	if ack.LeaseID != got.LeaseID || ack.TTLMS != 5000 || ack.RemainingMS > 5000 || int32(ack.ExpiresAtMS-got.ExpiresAtMS) < 500 {
		t.Fatalf("heartbeatAck = %s (acquired with expiresAtMs %d)", m.raw, got.ExpiresAtMS)
	}
	b.changed("heartbeat")

	// Wrong token, wrong id.
	wantWSError(t, a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": "AAAAAAAAAAAAAAAAAAAAAA"})), wire.CodeLeaseInvalid)
	wantWSError(t, a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": "cl_0000", "leaseToken": got.LeaseToken})), wire.CodeLeaseInvalid)

	// Status over the socket, without the token.
	m = b.reply(b.send(map[string]any{"type": "control.status"}))
	if m.Type != "control.status" || !m.Success || strings.Contains(m.raw, "leaseToken") {
		t.Fatalf("status: %s", m.raw)
	}
	if s := m.state(t); !s.Active || s.LeaseID != got.LeaseID || s.OwnerWSClientID != got.OwnerWSClientID {
		t.Fatalf("status = %+v", s)
	}

	// Re-acquire by the owner refreshes the same lease: its expiry moves
	// on as the heartbeat's did.
	pollUntil(t, 10*time.Second, "the countdown to move", func() bool { return restStatus(t, env.srv.URL).RemainingMS < 4500 })
	again := acquire(t, a, "K1 Composer")
	if again.LeaseID != got.LeaseID || again.LeaseToken != got.LeaseToken || again.RemainingMS > 5000 || int32(again.ExpiresAtMS-ack.ExpiresAtMS) < 500 {
		t.Fatalf("re-acquire = %+v, want a refresh of %s (expiresAtMs %d after the heartbeat)", again, got.LeaseID, ack.ExpiresAtMS)
	}

	// Release: acknowledged, broadcast, and the lease is free.
	m = a.reply(a.send(map[string]any{"type": "control.release", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken, "reason": "user_exit"}))
	var rel struct {
		Released bool   `json:"released"`
		LeaseID  string `json:"leaseId"`
		Reason   string `json:"reason"`
	}
	json.Unmarshal(m.Data, &rel)
	if m.Type != "control.released" || !rel.Released || rel.LeaseID != got.LeaseID || rel.Reason != "user_exit" {
		t.Fatalf("release: %s", m.raw)
	}
	if ch := b.changed("released").state(t); ch.Active || ch.LeaseID != got.LeaseID {
		t.Fatalf("stateChanged released = %+v", ch)
	}
	if restStatus(t, env.srv.URL).Active {
		t.Fatal("status active after release")
	}
	// A released lease's credentials are refused.
	wantWSError(t, a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken})), wire.CodeLeaseInvalid)

	// Now the other client gets it, with a new id and token.
	other := acquire(t, b, "other")
	if other.LeaseID == got.LeaseID || other.LeaseToken == got.LeaseToken || other.OwnerWSClientID == got.OwnerWSClientID {
		t.Fatalf("second lease = %+v", other)
	}
	checkToken(t, other.LeaseToken)
	if a.changed("acquired").state(t).OwnerClientName != "other" {
		t.Fatal("the first client did not see the second acquire")
	}
}

// TestControlExpiryAndDisconnect: a lease whose heartbeats stop expires
// (broadcast to the others); an owner's disconnect releases its lease.
func TestControlExpiryAndDisconnect(t *testing.T) {
	env := newControlEnv(t, Options{})
	a := dialControl(t, env.srv.URL, nil)
	b := dialControl(t, env.srv.URL, nil)

	start := time.Now()
	l := acquire(t, a, "short", "ttlMs", 1000)
	if l.TTLMS != 1000 || l.HeartbeatIntervalMS != 333 {
		t.Fatalf("ttlMs 1000 lease = %+v", l)
	}
	ch := b.changed("expired").state(t)
	if el := time.Since(start); el < time.Second {
		t.Fatalf("expired after %v, before its TTL", el)
	}
	if ch.Active || ch.LeaseID != l.LeaseID {
		t.Fatalf("stateChanged expired = %+v", ch)
	}
	a.changed("expired")
	wantWSError(t, a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": l.LeaseID, "leaseToken": l.LeaseToken})), wire.CodeLeaseExpired)
	// The expired owner may acquire again: a new lease.
	l2 := acquire(t, a, "short")
	if l2.LeaseID == l.LeaseID {
		t.Fatal("re-acquire after expiry kept the expired lease")
	}

	// The owner goes away: its lease is released for everyone.
	a.c.Close(websocket.StatusNormalClosure, "bye")
	ch = b.changed("ownerDisconnected").state(t)
	if ch.Active || ch.LeaseID != l2.LeaseID {
		t.Fatalf("stateChanged ownerDisconnected = %+v", ch)
	}
	if restStatus(t, env.srv.URL).Active {
		t.Fatal("status active after the owner disconnected")
	}
	acquire(t, b, "next")
}

// TestControlGate checks the admin routes while the control lease is
// active: 428 / 403 / 409 CONTROL_LOCKED / 409 LEASE_EXPIRED, never 423,
// and free passage while it is not.
func TestControlGate(t *testing.T) {
	env := newControlEnv(t, Options{})
	u := env.srv.URL + "/v1/leases/ls_0000/revoke"
	// No control lease: the route answers for itself.
	if code, b := restDo(t, "POST", u, `{"reason":"x"}`); code != 404 {
		t.Fatalf("ungated revoke: %d %s", code, b)
	}
	a := dialControl(t, env.srv.URL, nil)
	b := dialControl(t, env.srv.URL, nil)
	// 3 s: the checks below run while it lives, however slowly a loaded
	// machine answers them; then it expires.
	l1 := acquire(t, a, "K1 Composer", "ttlMs", 3000)

	code, body := restDo(t, "POST", u, `{"reason":"x"}`)
	e := restError(t, code, body, 428, wire.CodeLeaseRequired)
	if e.RequiredHeader != "X-Control-Lease" || e.OwnerClientName == nil || *e.OwnerClientName != "K1 Composer" {
		t.Fatalf("428 details = %+v", e)
	}
	code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", "AAAAAAAAAAAAAAAAAAAAAA")
	restError(t, code, body, 403, wire.CodeLeaseInvalid)
	code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", "AAAAAAAAAAAAAAAAAAAAAA", "X-Control-Lease-Id", l1.LeaseID)
	restError(t, code, body, 403, wire.CodeLeaseInvalid)
	// The owner's token passes, with or without the id.
	if code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", l1.LeaseToken); code != 404 {
		t.Fatalf("owner's revoke: %d %s", code, body)
	}
	if code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", l1.LeaseToken, "X-Control-Lease-Id", l1.LeaseID); code != 404 {
		t.Fatalf("owner's revoke with id: %d %s", code, body)
	}
	// Read routes are not gated.
	if code, body = restDo(t, "GET", env.srv.URL+"/v1/leases", ""); code != 200 {
		t.Fatalf("list under the control lease: %d %s", code, body)
	}

	// l1 expires (no heartbeats); b takes the lease. l1's token is expired.
	b.changed("expired")
	l2 := acquire(t, b, "other")
	code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", l1.LeaseToken, "X-Control-Lease-Id", l1.LeaseID)
	restError(t, code, body, 409, wire.CodeLeaseExpired)

	// b releases; a takes it again; b's old token names another owner.
	b.reply(b.send(map[string]any{"type": "control.release", "leaseId": l2.LeaseID, "leaseToken": l2.LeaseToken}))
	l3 := acquire(t, a, "K1 Composer")
	code, body = restDo(t, "POST", u, `{"reason":"x"}`, "X-Control-Lease", l2.LeaseToken, "X-Control-Lease-Id", l2.LeaseID)
	e = restError(t, code, body, 409, wire.CodeControlLocked)
	if e.OwnerClientName == nil || *e.OwnerClientName != "K1 Composer" || e.RemainingMS == nil || *e.RemainingMS <= 0 {
		t.Fatalf("CONTROL_LOCKED details = %+v", e)
	}
	// Every mutating admin route is gated, the cluster's too.
	for _, r := range [][2]string{{"POST", "/v1/cluster/transfer-leadership"}, {"DELETE", "/v1/cluster/members/x"},
		{"POST", "/v1/holders/w/release"}, {"PUT", "/v1/cluster/snapshot"}, {"DELETE", "/v1/sessions/ss_00"}} {
		code, body = restDo(t, r[0], env.srv.URL+r[1], "")
		restError(t, code, body, 428, wire.CodeLeaseRequired)
	}
	// Admin reads are not (the control protocol's matrix: read-only REST is allowed).
	if code, body = restDo(t, "GET", env.srv.URL+"/v1/cluster/local", ""); code != 200 {
		t.Fatalf("GET /v1/cluster/local under the control lease: %d %s", code, body)
	}
	// Status 423 never appears; the lease's own countdown reaching zero
	// before expiry commits is LEASE_EXPIRED too (checked in node tests).
	_ = l3
}

// TestControlBadInput: malformed messages get an error naming the field and
// change nothing; the public lease API refuses the control lease.
func TestControlBadInput(t *testing.T) {
	env := newControlEnv(t, Options{Control: ControlOptions{MaxMessageBytes: 1024}})
	a := dialControl(t, env.srv.URL, nil)
	for _, tc := range []struct{ msg, field string }{
		{`{"type":"control.acquire","requestId":"r1","scope":"local"}`, "scope"},
		{`{"type":"control.take","requestId":"r1"}`, "type"},
		{`{"requestId":"r1"}`, "type"},
		{`{"type":"control.acquire","requestId":"r1","force":true}`, "force"},
		{`{"type":"control.acquire","requestId":"r1","ttlMs":10}`, "ttlMs"},
		{`{"type":"control.acquire","requestId":"r1","ttlMs":3600000}`, "ttlMs"},
		{`{"type":"control.acquire","requestId":"r1","clientName":"a\u0001b"}`, "clientName"},
		{`{"type":"control.heartbeat","requestId":"r1","leaseId":"cl_1"}`, "leaseToken"},
		{`{"type":"control.release","requestId":"r1","leaseToken":"x"}`, "leaseId"},
		{`{"type":"control.release","requestId":"r1","leaseId":"cl_1","leaseToken":"x","reason":"owner_disconnected"}`, "reason"},
		{`{"type":"control.acquire","requestId":"r1"} {}`, ""},
		{`{"type":"control.acquire","requestId":1}`, "requestId"},
	} {
		a.sendRaw(tc.msg)
		m := a.next(20*time.Second, "error for "+tc.msg, func(m wsMsg) bool { return m.Type == "error" })
		if m.Error == nil || m.Error.Code != wire.CodeInvalidArgument || m.Error.Field != tc.field {
			t.Errorf("%s: got %s, want INVALID_ARGUMENT field %q", tc.msg, m.raw, tc.field)
		}
	}
	if restStatus(t, env.srv.URL).Active {
		t.Fatal("bad input acquired the control lease")
	}
	l := acquire(t, a, "ok")
	// The public lease API neither grants the reserved key nor touches a
	// control lease.
	code, body := restDo(t, "POST", env.srv.URL+"/v1/leases", `{"key":"_leasehold/control/global","holder":"h","ttl_ms":5000}`)
	if code != 400 || !strings.Contains(string(body), `"key"`) {
		t.Fatalf("acquire of the reserved key: %d %s", code, body)
	}
	code, body = restDo(t, "POST", env.srv.URL+"/v1/leases/"+l.LeaseID+"/renew", "", "X-Lease-Token", l.LeaseToken)
	if code != 400 {
		t.Fatalf("REST renew of the control lease: %d %s", code, body)
	}
	code, body = restDo(t, "DELETE", env.srv.URL+"/v1/leases/"+l.LeaseID, "", "X-Lease-Token", l.LeaseToken)
	if code != 400 {
		t.Fatalf("REST release of the control lease: %d %s", code, body)
	}
	if s := restStatus(t, env.srv.URL); !s.Active || s.LeaseID != l.LeaseID {
		t.Fatalf("status after refused REST calls = %+v", s)
	}
	// A message over the limit closes the socket with 1009.
	a.sendRaw(`{"type":"control.status","requestId":"` + strings.Repeat("x", 2000) + `"}`)
	<-a.done
	if websocket.CloseStatus(a.err) != websocket.StatusMessageTooBig {
		t.Fatalf("oversized message: %v", a.err)
	}
}

// TestControlLimitsAndAuth: the socket needs the write scope, the status the
// read scope, and a node serves at most MaxSockets sockets.
func TestControlLimitsAndAuth(t *testing.T) {
	env := newControlEnv(t, Options{Tokens: testTokens(t), Control: ControlOptions{MaxSockets: 2}})
	_, err := tryDialControl(env.srv.URL, nil)
	var de *dialError
	if !errors.As(err, &de) || de.status != 401 {
		t.Fatalf("socket without a token: %v", err)
	}
	_, err = tryDialControl(env.srv.URL, http.Header{"Authorization": {"Bearer " + readToken}})
	if !errors.As(err, &de) || de.status != 403 {
		t.Fatalf("socket with a read token: %v", err)
	}
	if code, b := restDo(t, "GET", env.srv.URL+"/v1/control/status", ""); code != 401 {
		t.Fatalf("status without a token: %d %s", code, b)
	}
	if code, b := restDo(t, "GET", env.srv.URL+"/v1/control/status", "", "Authorization", "Bearer "+readToken); code != 200 {
		t.Fatalf("status with a read token: %d %s", code, b)
	}
	w := http.Header{"Authorization": {"Bearer " + writeToken}}
	a := dialControl(t, env.srv.URL, w)
	dialControl(t, env.srv.URL, w)
	_, err = tryDialControl(env.srv.URL, w)
	if !errors.As(err, &de) || de.status != 503 || !strings.Contains(de.body, "UNAVAILABLE") {
		t.Fatalf("third socket over a limit of 2: %v", err)
	}
	acquire(t, a, "authorised")
	// The admin routes need both the admin scope and the control token.
	code, b := restDo(t, "POST", env.srv.URL+"/v1/cluster/transfer-leadership", "", "Authorization", "Bearer "+adminToken)
	restError(t, code, b, 428, wire.CodeLeaseRequired)
}

// TestControlTokenNeverLeaks scans the status, broadcasts, other clients'
// messages, the event stream, the lease listing, logs and metrics for the
// control lease's token.
func TestControlTokenNeverLeaks(t *testing.T) {
	env := newControlEnv(t, Options{})
	// The event stream, from before the acquire.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", env.srv.URL+"/v1/events?prefix=_leasehold/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sse syncBuffer
	sseDone := make(chan struct{})
	go func() {
		defer close(sseDone)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			sse.Write(append(sc.Bytes(), '\n'))
		}
	}()

	a := dialControl(t, env.srv.URL, nil)
	b := dialControl(t, env.srv.URL, nil)
	l := acquire(t, a, "secretive")
	for range 3 {
		a.reply(a.send(map[string]any{"type": "control.heartbeat", "leaseId": l.LeaseID, "leaseToken": l.LeaseToken}))
	}
	a.reply(a.send(map[string]any{"type": "control.status"}))
	b.reply(b.send(map[string]any{"type": "control.acquire"}))
	restDo(t, "POST", env.srv.URL+"/v1/leases/ls_1/revoke", "", "X-Control-Lease", l.LeaseToken)
	restDo(t, "POST", env.srv.URL+"/v1/leases/ls_1/revoke", "", "X-Control-Lease", "wrong", "X-Control-Lease-Id", l.LeaseID)
	_, status := restDo(t, "GET", env.srv.URL+"/v1/control/status", "")
	_, list := restDo(t, "GET", env.srv.URL+"/v1/leases?prefix=_leasehold/", "")
	_, one := restDo(t, "GET", env.srv.URL+"/v1/leases/"+l.LeaseID, "")
	a.c.Close(websocket.StatusNormalClosure, "")
	b.changed("ownerDisconnected")
	pollUntil(t, 20*time.Second, "the events in the stream", func() bool {
		return strings.Contains(sse.String(), "released") && strings.Count(sse.String(), "renewed") >= 3
	})
	_, metrics := restDo(t, "GET", env.srv.URL+"/metrics", "")

	// The owner's own transcript carries it only in control.acquired.
	var own []string
	for _, line := range strings.Split(a.transcript(), "\n") {
		if !strings.Contains(line, `"control.acquired"`) {
			own = append(own, line)
		}
	}
	for name, text := range map[string]string{
		"other client's messages": b.transcript(), "owner's other messages": strings.Join(own, "\n"),
		"status": string(status), "listing": string(list), "lease": string(one), "event stream": sse.String(),
		"logs": env.logs.String(), "metrics": string(metrics),
	} {
		if text == "" && name != "owner's other messages" {
			t.Errorf("%s is empty: the scan would prove nothing", name)
		}
		if strings.Contains(text, l.LeaseToken) {
			t.Errorf("the control lease token appears in the %s", name)
		}
	}
	if !strings.Contains(string(list), l.LeaseID) {
		t.Errorf("listing does not show the control lease: %s", list)
	}
}

// TestControlMountedByAnApplication mounts the exported handlers at the
// control protocol's own paths, with auth, and gates an application route.
func TestControlMountedByAnApplication(t *testing.T) {
	env := newControlEnv(t, Options{})
	ctl := NewControl(ControlFromNode(env.n), ControlOptions{Tokens: testTokens(t)})
	mux := http.NewServeMux()
	mux.Handle("GET /api/v1/control/ws", ctl.WebSocket())
	mux.Handle("GET /api/v1/control/status", ctl.Status())
	mux.Handle("POST /api/v1/presets", ctl.Gate(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	ws := "ws" + strings.TrimPrefix(app.URL, "http") + "/api/v1/control/ws"

	var de *dialError
	if _, err := tryDialURL(ws, nil); !errors.As(err, &de) || de.status != 401 {
		t.Fatalf("socket without a token: %v", err)
	}
	if _, err := tryDialURL(ws, http.Header{"Authorization": {"Bearer " + readToken}}); !errors.As(err, &de) || de.status != 403 {
		t.Fatalf("socket with a read token: %v", err)
	}
	// Before anyone holds the lease the route is open.
	if code, b := restDo(t, "POST", app.URL+"/api/v1/presets", ""); code != 204 {
		t.Fatalf("ungated preset: %d %s", code, b)
	}
	a := dialControlURL(t, ws, http.Header{"Authorization": {"Bearer " + writeToken}})
	l := acquire(t, a, "K1 Composer")
	code, b := restDo(t, "POST", app.URL+"/api/v1/presets", "")
	restError(t, code, b, 428, wire.CodeLeaseRequired)
	code, b = restDo(t, "POST", app.URL+"/api/v1/presets", "", "X-Control-Lease", "nope")
	restError(t, code, b, 403, wire.CodeLeaseInvalid)
	if code, b = restDo(t, "POST", app.URL+"/api/v1/presets", "", "X-Control-Lease", l.LeaseToken, "X-Control-Lease-Id", l.LeaseID); code != 204 {
		t.Fatalf("preset with the token: %d %s", code, b)
	}
	if code, b = restDo(t, "GET", app.URL+"/api/v1/control/status", ""); code != 401 {
		t.Fatalf("status without a token: %d %s", code, b)
	}
	code, b = restDo(t, "GET", app.URL+"/api/v1/control/status", "", "Authorization", "Bearer "+readToken)
	var st node.ControlState
	if code != 200 || json.Unmarshal(b, &st) != nil || !st.Active || st.LeaseID != l.LeaseID || strings.Contains(string(b), l.LeaseToken) {
		t.Fatalf("status: %d %s", code, b)
	}
	// The API's own clients see the application's socket's changes too.
	obs := dialControl(t, env.srv.URL, nil)
	// A socket reads its first message only once its hub follows the
	// events, so an answered status means obs will see what comes next.
	obs.reply(obs.send(map[string]any{"type": "control.status"}))
	a.reply(a.send(map[string]any{"type": "control.release", "leaseId": l.LeaseID, "leaseToken": l.LeaseToken}))
	obs.changed("released")
}
