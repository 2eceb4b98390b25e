package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// counted wraps a handler and counts the requests it sees.
type counted struct {
	n atomic.Int64
	h http.HandlerFunc
}

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.h(w, r)
}

func server(t *testing.T, h http.HandlerFunc) (*httptest.Server, *counted) {
	t.Helper()
	c := &counted{h: h}
	s := httptest.NewServer(c)
	t.Cleanup(s.Close)
	return s, c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code wire.Code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg}})
}

// refusedAddr returns an address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newClient(t *testing.T, addrs ...string) *Client {
	t.Helper()
	c, err := New(addrs, Options{Token: "bearer-secret", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		status     int
		code       wire.Code
		retryAfter time.Duration
		check      func(t *testing.T, ne *wire.Error)
	}{
		{
			name: "lease held with details",
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 409, map[string]any{"error": map[string]any{
					"code": "LEASE_HELD", "message": "key is held", "key": "k",
					"holders": []map[string]any{{"holder": "h1", "lease_id": "ls_1", "remaining_ms": 1500}},
				}})
			},
			status: 409, code: wire.CodeLeaseHeld,
			check: func(t *testing.T, ne *wire.Error) {
				if ne.Key != "k" || len(ne.Holders) != 1 || ne.Holders[0].Holder != "h1" || ne.Holders[0].RemainingMS != 1500 {
					t.Errorf("details not decoded: %+v", ne)
				}
			},
		},
		{
			name: "invalid argument names field",
			handler: func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, 400, map[string]any{"error": map[string]any{"code": "INVALID_ARGUMENT", "message": "bad", "field": "ttl_ms"}})
			},
			status: 400, code: wire.CodeInvalidArgument,
			check: func(t *testing.T, ne *wire.Error) {
				if ne.Field != "ttl_ms" {
					t.Errorf("field = %q", ne.Field)
				}
			},
		},
		{
			name: "no leader with retry-after",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "2")
				writeErr(w, 503, wire.CodeNoLeader, "no leader")
			},
			status: 503, code: wire.CodeNoLeader, retryAfter: 2 * time.Second,
		},
		{
			name: "non-json body from a proxy",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(502)
				io.WriteString(w, "<html>bad gateway</html>")
			},
			status: 502, code: "UNAVAILABLE",
			check: func(t *testing.T, ne *wire.Error) {
				if !strings.Contains(ne.Message, "bad gateway") {
					t.Errorf("message = %q", ne.Message)
				}
			},
		},
		{
			name:    "empty 404",
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) },
			status:  404, code: wire.CodeNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := server(t, tt.handler)
			c := newClient(t, s.URL)
			_, err := c.Get(context.Background(), "ls_1")
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v (%T), want *APIError", err, err)
			}
			if ae.StatusCode != tt.status || StatusCode(err) != tt.status {
				t.Errorf("status = %d, want %d", ae.StatusCode, tt.status)
			}
			if ae.RetryAfter != tt.retryAfter {
				t.Errorf("retry after = %v, want %v", ae.RetryAfter, tt.retryAfter)
			}
			var ne *wire.Error
			if !errors.As(err, &ne) || ne.Code != tt.code || ErrorCode(err) != tt.code {
				t.Fatalf("node error = %+v, want code %s", ne, tt.code)
			}
			if !errors.Is(err, &wire.Error{Code: tt.code}) {
				t.Errorf("errors.Is does not match code %s", tt.code)
			}
			if !strings.HasPrefix(err.Error(), string(tt.code)+": ") {
				t.Errorf("Error() = %q, want CODE: message", err.Error())
			}
			if tt.check != nil {
				tt.check(t, ne)
			}
		})
	}
}

func TestFailover(t *testing.T) {
	noLeader := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeErr(w, 503, wire.CodeNoLeader, "no leader")
	}
	ok := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeJSON(w, 200, wire.Lease{LeaseID: "ls_1", State: "active"})
	}
	// outOfService: a server that took itself out of service (its state
	// diverged) applied nothing, whatever the request.
	outOfService := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeErr(w, 503, wire.CodeOutOfService, "this server is out of service (diverged)")
	}
	// hangUp reads the request, then drops the connection without answering:
	// the request may have been applied.
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	acquire := func(key string) func(c *Client) error {
		return func(c *Client) error {
			_, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000, IdempotencyKey: key})
			return err
		}
	}
	get := func(c *Client) error { _, err := c.Get(context.Background(), "ls_1"); return err }
	renew := func(c *Client) error { _, err := c.Renew(context.Background(), "ls_1", "tok", 0); return err }

	tests := []struct {
		name      string
		first     http.HandlerFunc // nil: connection refused
		op        func(*Client) error
		wantErr   bool
		wantFirst int64 // requests the first server saw
		wantSec   int64 // requests the second server saw
	}{
		{"read moves on after no leader", noLeader, get, false, 1, 1},
		{"read moves on after refused", nil, get, false, 0, 1},
		{"read moves on after hang-up", hangUp, get, false, 1, 1},
		{"idempotent write moves on after no leader", noLeader, acquire("idem-1"), false, 1, 1},
		{"idempotent write moves on after hang-up", hangUp, acquire("idem-1"), false, 1, 1},
		{"plain write moves on after refused", nil, acquire(""), false, 0, 1},
		{"plain write stays after no leader", noLeader, acquire(""), true, 1, 0},
		{"plain write stays after hang-up", hangUp, acquire(""), true, 1, 0},
		{"renew stays after hang-up", hangUp, renew, true, 1, 0},
		{"renew moves on after refused", nil, renew, false, 0, 1},
		{"read moves on after out of service", outOfService, get, false, 1, 1},
		{"plain write moves on after out of service", outOfService, acquire(""), false, 1, 1},
		{"renew moves on after out of service", outOfService, renew, false, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var first string
			var fc *counted
			if tt.first == nil {
				first = refusedAddr(t)
			} else {
				var s *httptest.Server
				s, fc = server(t, tt.first)
				first = s.URL
			}
			s2, sc := server(t, ok)
			c := newClient(t, first, s2.URL)
			err := tt.op(c)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if fc != nil && fc.n.Load() != tt.wantFirst {
				t.Errorf("first server saw %d requests, want %d", fc.n.Load(), tt.wantFirst)
			}
			if sc.n.Load() != tt.wantSec {
				t.Errorf("second server saw %d requests, want %d", sc.n.Load(), tt.wantSec)
			}
		})
	}
}

func TestFailoverRemembersWorkingAddress(t *testing.T) {
	s1, c1 := server(t, func(w http.ResponseWriter, r *http.Request) { writeErr(w, 503, wire.CodeNoLeader, "no leader") })
	s2, c2 := server(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, wire.Lease{LeaseID: "ls_1"}) })
	c := newClient(t, s1.URL, s2.URL)
	for range 3 {
		if _, err := c.Get(context.Background(), "ls_1"); err != nil {
			t.Fatal(err)
		}
	}
	if c1.n.Load() != 1 || c2.n.Load() != 3 {
		t.Errorf("requests: first %d (want 1), second %d (want 3)", c1.n.Load(), c2.n.Load())
	}
}

func TestUnretriedWriteMovesTheNextRequest(t *testing.T) {
	s1, c1 := server(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	})
	s2, c2 := server(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, wire.Lease{LeaseID: "ls_1"}) })
	c := newClient(t, s1.URL, s2.URL)
	if _, err := c.Renew(context.Background(), "ls_1", "tok", 0); err == nil {
		t.Fatal("renew after a hang-up succeeded")
	}
	if _, err := c.Renew(context.Background(), "ls_1", "tok", 0); err != nil {
		t.Fatalf("second renew: %v", err)
	}
	if c1.n.Load() != 1 || c2.n.Load() != 1 {
		t.Errorf("requests: first %d, second %d; want 1 and 1", c1.n.Load(), c2.n.Load())
	}
}

func TestAllAddressesFail(t *testing.T) {
	s1, _ := server(t, func(w http.ResponseWriter, r *http.Request) { writeErr(w, 503, wire.CodeNoLeader, "one") })
	s2, _ := server(t, func(w http.ResponseWriter, r *http.Request) { writeErr(w, 503, wire.CodeNoLeader, "two") })
	c := newClient(t, s1.URL, s2.URL)
	_, err := c.Cluster(context.Background())
	if ErrorCode(err) != wire.CodeNoLeader || !strings.Contains(err.Error(), "two") {
		t.Fatalf("err = %v, want the last node's NO_LEADER", err)
	}
}

func TestRequestShapes(t *testing.T) {
	type seen struct {
		method, path, query string
		header              http.Header
		body                map[string]any
	}
	got := make(chan seen, 1)
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		data, _ := io.ReadAll(r.Body)
		if len(data) > 0 {
			if err := json.Unmarshal(data, &body); err != nil {
				t.Errorf("body %q: %v", data, err)
			}
		}
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body}
		switch {
		case r.URL.Path == "/v1/heartbeat":
			writeJSON(w, 200, map[string]any{"results": []map[string]any{{"lease_id": "ls_1", "ok": true}}})
		case strings.HasPrefix(r.URL.Path, "/v1/sessions"):
			writeJSON(w, 200, wire.Session{SessionID: "ss_1"})
		default:
			writeJSON(w, 200, wire.Lease{LeaseID: "ls_1"})
		}
	})
	ctx := context.Background()
	c, err := New([]string{s.URL}, Options{Token: "tkn", StaleReads: true, ControlLease: "ctl"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		op     func() error
		method string
		path   string
		query  string
		header map[string]string // "" value: must be absent
		body   map[string]any
	}{
		{
			name: "session-bound acquire",
			op: func() error {
				_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "a/b", Holder: "h", SessionID: "ss_1", SessionToken: "stok", WaitMS: 10})
				return err
			},
			method: "POST", path: "/v1/leases",
			header: map[string]string{"X-Session-Token": "stok", "Authorization": "Bearer tkn", "X-Control-Lease": ""},
			body:   map[string]any{"key": "a/b", "holder": "h", "session_id": "ss_1", "wait_ms": float64(10)},
		},
		{
			name:   "renew with ttl",
			op:     func() error { _, err := c.Renew(ctx, "ls_1", "ltok", 5000); return err },
			method: "POST", path: "/v1/leases/ls_1/renew",
			header: map[string]string{"X-Lease-Token": "ltok"},
			body:   map[string]any{"ttl_ms": float64(5000)},
		},
		{
			name: "renew with metadata",
			op: func() error {
				_, err := c.RenewWith(ctx, wire.RenewRequest{LeaseID: "ls_1", Token: "ltok", Metadata: map[string]string{"fps": "15"}})
				return err
			},
			method: "POST", path: "/v1/leases/ls_1/renew",
			header: map[string]string{"X-Lease-Token": "ltok"},
			body:   map[string]any{"metadata": map[string]any{"fps": "15"}},
		},
		{
			name: "renew clearing metadata",
			op: func() error {
				_, err := c.RenewWith(ctx, wire.RenewRequest{LeaseID: "ls_1", Token: "ltok", Metadata: map[string]string{}})
				return err
			},
			method: "POST", path: "/v1/leases/ls_1/renew",
			header: map[string]string{"X-Lease-Token": "ltok"},
			body:   map[string]any{"metadata": map[string]any{}},
		},
		{
			name: "heartbeat with metadata",
			op: func() error {
				_, err := c.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: "ls_1", Token: "t1", Metadata: map[string]string{"a": "1"}}, {LeaseID: "ls_2", Token: "t2"}})
				return err
			},
			method: "POST", path: "/v1/heartbeat",
			body: map[string]any{"leases": []any{map[string]any{"lease_id": "ls_1", "token": "t1", "metadata": map[string]any{"a": "1"}},
				map[string]any{"lease_id": "ls_2", "token": "t2"}}},
		},
		{
			name: "release bound lease with session token",
			op: func() error {
				_, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: "ls_1", SessionToken: "stok", Reason: "done"})
				return err
			},
			method: "DELETE", path: "/v1/leases/ls_1",
			header: map[string]string{"X-Session-Token": "stok", "X-Lease-Token": ""},
			body:   map[string]any{"reason": "done"},
		},
		{
			name:   "revoke is admin",
			op:     func() error { _, err := c.Revoke(ctx, "ls_1", "ops"); return err },
			method: "POST", path: "/v1/leases/ls_1/revoke",
			header: map[string]string{"X-Control-Lease": "ctl"},
			body:   map[string]any{"reason": "ops"},
		},
		{
			name: "list with filters and stale",
			op: func() error {
				_, err := c.List(ctx, wire.ListRequest{Prefix: "jobs/", State: "active", Limit: 10, After: "cur"})
				return err
			},
			method: "GET", path: "/v1/leases", query: "after=cur&limit=10&prefix=jobs%2F&stale=true&state=active",
		},
		{
			name:   "get escapes the id",
			op:     func() error { _, err := c.Get(ctx, "ls/1"); return err },
			method: "GET", path: "/v1/leases/ls/1", query: "stale=true",
		},
		{
			name:   "session heartbeat",
			op:     func() error { _, err := c.SessionHeartbeat(ctx, "ss_1", "stok"); return err },
			method: "POST", path: "/v1/sessions/ss_1/heartbeat",
			header: map[string]string{"X-Session-Token": "stok"},
		},
		{
			name:   "forced end of session sends no token",
			op:     func() error { _, err := c.EndSession(ctx, "ss_1", ""); return err },
			method: "DELETE", path: "/v1/sessions/ss_1",
			header: map[string]string{"X-Session-Token": "", "X-Control-Lease": "ctl"},
		},
		{
			name: "bulk heartbeat",
			op: func() error {
				res, err := c.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: "ls_1", Token: "t1"}})
				if err == nil && (len(res) != 1 || !res[0].OK) {
					t.Errorf("results = %+v", res)
				}
				return err
			},
			method: "POST", path: "/v1/heartbeat",
			body: map[string]any{"leases": []any{map[string]any{"lease_id": "ls_1", "token": "t1"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.op(); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.method != tt.method || r.path != tt.path || r.query != tt.query {
				t.Errorf("got %s %s?%s, want %s %s?%s", r.method, r.path, r.query, tt.method, tt.path, tt.query)
			}
			for k, v := range tt.header {
				if g := r.header.Get(k); g != v {
					t.Errorf("header %s = %q, want %q", k, g, v)
				}
			}
			if tt.body != nil {
				for k, v := range tt.body {
					gb, _ := json.Marshal(r.body[k])
					wb, _ := json.Marshal(v)
					if string(gb) != string(wb) {
						t.Errorf("body %s = %s, want %s", k, gb, wb)
					}
				}
				if _, ok := r.body["SessionToken"]; ok {
					t.Error("session token leaked into the body")
				}
			}
		})
	}
}

func TestDecodeResultsBareArray(t *testing.T) {
	res, err := decodeResults(json.RawMessage(`[{"lease_id":"ls_1","ok":false,"error":{"code":"LEASE_EXPIRED","message":"gone"}}]`))
	if err != nil || len(res) != 1 || res[0].Error == nil || res[0].Error.Code != wire.CodeLeaseExpired {
		t.Fatalf("res = %+v, err = %v", res, err)
	}
}

func TestNewRejectsBadAddresses(t *testing.T) {
	for _, addrs := range [][]string{nil, {""}, {"ftp://x:1"}, {"http://"}} {
		if _, err := New(addrs, Options{}); err == nil {
			t.Errorf("New(%q) succeeded", addrs)
		}
	}
	c, err := New([]string{"127.0.0.1:7700", " https://h:1/ "}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Addrs(), " "); got != "http://127.0.0.1:7700 https://h:1" {
		t.Errorf("addrs = %q", got)
	}
}

// TestBounds: an out-of-range INVALID_ARGUMENT carries its bounds, and the
// client gives them as numbers; any other error has none.
func TestBounds(t *testing.T) {
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 400, map[string]any{"error": map[string]any{"code": "INVALID_ARGUMENT",
			"message": "ttl_ms must be 1000-86400000, got 5", "field": "ttl_ms", "min": 1000, "max": 86400000}})
	})
	c := newClient(t, s.URL)
	_, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 5})
	field, lo, hi, ok := Bounds(err)
	if !ok || field != "ttl_ms" || lo != 1000 || hi != 86400000 {
		t.Fatalf("Bounds(%v) = %q %d %d %v", err, field, lo, hi, ok)
	}
	s2, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 400, wire.CodeInvalidArgument, "bad key")
	})
	_, err = newClient(t, s2.URL).Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 5000})
	if _, _, _, ok := Bounds(err); ok || err == nil {
		t.Fatalf("Bounds of %v: ok", err)
	}
}
