package api

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestRoutes exercises every route's happy path: status, what reached the
// node, and the answer's shape.
func TestRoutes(t *testing.T) {
	type check func(t *testing.T, f *fakeNode, body map[string]any)
	argsAre := func(method string, want ...any) check {
		return func(t *testing.T, f *fakeNode, _ map[string]any) {
			t.Helper()
			c := f.only(t, method)
			if !reflect.DeepEqual(c.args, want) {
				t.Errorf("%s args = %#v\nwant %#v", method, c.args, want)
			}
		}
	}
	tests := []struct {
		name         string
		method, path string
		body         string
		hdr          []string
		status       int
		check        check
		bodyCheck    func(t *testing.T, body map[string]any)
	}{
		{name: "acquire", method: "POST", path: "/v1/leases", status: 201,
			body: `{"key":"k","holder":"w1","ttl_ms":5000,"session_id":"ss_1","limit":3,"metadata":{"a":"b"},` +
				`"idempotency_key":"i1","wait_ms":100,"lock_delay_ms":200}`,
			hdr: []string{"X-Session-Token", "st"},
			check: argsAre("Acquire", wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 5000, SessionID: "ss_1",
				SessionToken: "st", Limit: 3, Metadata: map[string]string{"a": "b"}, IdempotencyKey: "i1",
				WaitMS: 100, LockDelayMS: 200}),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["token"] != "lease-secret" || b["lease_id"] != "ls_1" || b["fencing_token"] != 7.0 {
					t.Errorf("lease = %v", b)
				}
			}},
		{name: "get lease", method: "GET", path: "/v1/leases/ls_7", status: 200,
			check: argsAre("GetLease", "ls_7", false)},
		{name: "get lease stale", method: "GET", path: "/v1/leases/ls_7?stale=true", status: 200,
			check: argsAre("GetLease", "ls_7", true)},
		{name: "get lease bare stale", method: "GET", path: "/v1/leases/ls_7?stale", status: 200,
			check: argsAre("GetLease", "ls_7", true)},
		{name: "list leases", method: "GET", status: 200,
			path: "/v1/leases?key=k&prefix=p%2F&holder=w1&session_id=ss_1&state=active&limit=10&after=ls_0&stale=1",
			check: argsAre("ListLeases", wire.ListRequest{Key: "k", Prefix: "p/", Holder: "w1", SessionID: "ss_1",
				State: "active", Limit: 10, After: "ls_0"}, true),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if l, _ := b["leases"].([]any); len(l) != 1 || b["next"] != "ls_1" {
					t.Errorf("list = %v", b)
				}
			}},
		{name: "list leases empty", method: "GET", path: "/v1/leases?key=none", status: 200,
			bodyCheck: func(t *testing.T, b map[string]any) {
				if l, ok := b["leases"].([]any); !ok || len(l) != 0 {
					t.Errorf(`list = %v, want "leases": []`, b)
				}
			}},
		{name: "renew", method: "POST", path: "/v1/leases/ls_7/renew", body: `{"ttl_ms":3000}`, status: 200,
			hdr: []string{"X-Lease-Token", "lt"}, check: argsAre("Renew", wire.RenewRequest{LeaseID: "ls_7", Token: "lt", TTLMS: 3000})},
		{name: "renew metadata", method: "POST", path: "/v1/leases/ls_7/renew", body: `{"metadata":{"done":"12"}}`, status: 200,
			hdr: []string{"X-Lease-Token", "lt"}, check: argsAre("Renew", wire.RenewRequest{LeaseID: "ls_7", Token: "lt", Metadata: map[string]string{"done": "12"}})},
		{name: "renew clear metadata", method: "POST", path: "/v1/leases/ls_7/renew", body: `{"metadata":{}}`, status: 200,
			hdr: []string{"X-Lease-Token", "lt"}, check: argsAre("Renew", wire.RenewRequest{LeaseID: "ls_7", Token: "lt", Metadata: map[string]string{}})},
		{name: "renew null metadata", method: "POST", path: "/v1/leases/ls_7/renew", body: `{"metadata":null}`, status: 200,
			hdr: []string{"X-Lease-Token", "lt"}, check: argsAre("Renew", wire.RenewRequest{LeaseID: "ls_7", Token: "lt"})},
		{name: "renew no body", method: "POST", path: "/v1/leases/ls_7/renew", status: 200,
			hdr: []string{"X-Lease-Token", "lt"}, check: argsAre("Renew", wire.RenewRequest{LeaseID: "ls_7", Token: "lt"})},
		{name: "release", method: "DELETE", path: "/v1/leases/ls_7", body: `{"reason":"done"}`, status: 200,
			hdr:   []string{"X-Lease-Token", "lt"},
			check: argsAre("Release", wire.ReleaseRequest{LeaseID: "ls_7", Token: "lt", Reason: "done"}),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["state"] != "released" || b["end_reason"] != "done" {
					t.Errorf("lease = %v", b)
				}
			}},
		{name: "release reason in query", method: "DELETE", path: "/v1/leases/ls_7?reason=q", status: 200,
			hdr:   []string{"X-Session-Token", "st"},
			check: argsAre("Release", wire.ReleaseRequest{LeaseID: "ls_7", SessionToken: "st", Reason: "q"})},
		{name: "revoke", method: "POST", path: "/v1/leases/ls_7/revoke", body: `{"reason":"stuck"}`, status: 200,
			check: argsAre("Revoke", "ls_7", "stuck")},
		{name: "revoke no body", method: "POST", path: "/v1/leases/ls_7/revoke", status: 200,
			check: argsAre("Revoke", "ls_7", "")},
		{name: "heartbeat", method: "POST", path: "/v1/heartbeat", status: 200,
			body:  `{"leases":[{"lease_id":"ls_1","token":"a"},{"lease_id":"ls_2","token":"bad"}]}`,
			check: argsAre("Heartbeat", []wire.HeartbeatItem{{LeaseID: "ls_1", Token: "a"}, {LeaseID: "ls_2", Token: "bad"}}),
			bodyCheck: func(t *testing.T, b map[string]any) {
				rs, _ := b["results"].([]any)
				if len(rs) != 2 {
					t.Fatalf("results = %v", b)
				}
				second, _ := rs[1].(map[string]any)
				e, _ := second["error"].(map[string]any)
				if second["ok"] != false || e["code"] != "LEASE_TOKEN_INVALID" {
					t.Errorf("second result = %v", second)
				}
			}},
		{name: "create session", method: "POST", path: "/v1/sessions", status: 201,
			body:  `{"holder":"w1","ttl_ms":10000,"metadata":{"x":"y"}}`,
			check: argsAre("CreateSession", wire.SessionRequest{Holder: "w1", TTLMS: 10000, Metadata: map[string]string{"x": "y"}}),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["token"] != "session-secret" || b["session_id"] != "ss_1" {
					t.Errorf("session = %v", b)
				}
			}},
		{name: "get session", method: "GET", path: "/v1/sessions/ss_3?stale=false", status: 200,
			check: argsAre("GetSession", "ss_3", false)},
		{name: "list sessions", method: "GET", path: "/v1/sessions?holder=w1&after=ss_0&limit=5", status: 200,
			check: argsAre("ListSessions", "w1", "ss_0", 5, false)},
		{name: "list sessions empty", method: "GET", path: "/v1/sessions?holder=none", status: 200,
			bodyCheck: func(t *testing.T, b map[string]any) {
				if l, ok := b["sessions"].([]any); !ok || len(l) != 0 {
					t.Errorf(`list = %v, want "sessions": []`, b)
				}
			}},
		{name: "session heartbeat", method: "POST", path: "/v1/sessions/ss_3/heartbeat", status: 200,
			hdr: []string{"X-Session-Token", "st"}, check: argsAre("SessionHeartbeat", "ss_3", "st")},
		{name: "end session", method: "DELETE", path: "/v1/sessions/ss_3", status: 200,
			hdr: []string{"X-Session-Token", "st"}, check: argsAre("EndSession", "ss_3", "st", false)},
		{name: "end session forced", method: "DELETE", path: "/v1/sessions/ss_3", status: 200,
			check: argsAre("EndSession", "ss_3", "", true)},
		{name: "release holder", method: "POST", path: "/v1/holders/w1/release", body: `{"reason":"restart"}`,
			status: 200, check: argsAre("ReleaseHolder", "w1", "restart"),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["holder"] != "w1" || b["released"] != 3.0 {
					t.Errorf("answer = %v", b)
				}
			}},
		{name: "release holder escaped", method: "POST", path: "/v1/holders/rack%2F7%20w/release", status: 200,
			check: argsAre("ReleaseHolder", "rack/7 w", "")},
		{name: "release holder space", method: "POST", path: "/v1/holders/a%20b/release", status: 200,
			check: argsAre("ReleaseHolder", "a b", "")},
		{name: "validate fencing", method: "POST", path: "/v1/validate", status: 200,
			body:  `{"key":"k","fencing_token":18446744073709551615}`,
			check: argsAre("Validate", wire.ValidateRequest{Key: "k", FencingToken: 1<<64 - 1}),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["valid"] != true || b["reason"] != "active" || b["current"] == nil {
					t.Errorf("answer = %v", b)
				}
			}},
		{name: "validate token", method: "POST", path: "/v1/validate", status: 200,
			body:  `{"lease_id":"ls_1","token":"lt"}`,
			check: argsAre("Validate", wire.ValidateRequest{LeaseID: "ls_1", Token: "lt"})},
		{name: "cluster", method: "GET", path: "/v1/cluster", status: 200, check: argsAre("ClusterStatus"),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["leader"] != "n1" {
					t.Errorf("status = %v", b)
				}
			}},
		{name: "remove member", method: "DELETE", path: "/v1/cluster/members/n3", status: 200,
			check: argsAre("RemoveMember", "n3"),
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["id"] != "n3" || b["removed"] != true {
					t.Errorf("answer = %v", b)
				}
			}},
		{name: "transfer to", method: "POST", path: "/v1/cluster/transfer-leadership", body: `{"id":"n2"}`,
			status: 200, check: argsAre("TransferLeadership", "n2")},
		{name: "transfer any", method: "POST", path: "/v1/cluster/transfer-leadership", status: 200,
			check: argsAre("TransferLeadership", "")},
		{name: "healthz", method: "GET", path: "/healthz", status: 200,
			bodyCheck: func(t *testing.T, b map[string]any) {
				if b["status"] != "ok" {
					t.Errorf("answer = %v", b)
				}
			}},
		{name: "readyz", method: "GET", path: "/readyz", status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			rec := do(t, New(f, Options{}), tt.method, tt.path, tt.body, tt.hdr...)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			if got := rec.Header().Get(headerIndex); got != "42" {
				t.Errorf("%s = %q, want 42", headerIndex, got)
			}
			var body map[string]any
			jsonOf(t, rec, &body)
			if tt.check != nil {
				tt.check(t, f, body)
			}
			if tt.bodyCheck != nil {
				tt.bodyCheck(t, body)
			}
		})
	}
}

func TestAcquireReplayIs200(t *testing.T) {
	f := newFake()
	f.replayed = true
	rec := do(t, New(f, Options{}), "POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000,"idempotency_key":"i"}`)
	if rec.Code != 200 {
		t.Fatalf("status = %d, want 200", rec.Code)
	}
	var l wire.Lease
	jsonOf(t, rec, &l)
	if l.Token == "" {
		t.Error("a replay must return the lease token again")
	}
}

func TestAcquireLocation(t *testing.T) {
	rec := do(t, New(newFake(), Options{}), "POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000}`)
	if got := rec.Header().Get("Location"); got != "/v1/leases/ls_1" {
		t.Errorf("Location = %q", got)
	}
}

// TestIndexReadAfterOperation: the index header reflects the node's state
// after the operation, not before it.
func TestIndexReadAfterOperation(t *testing.T) {
	f := &advancingNode{fakeNode: newFake()}
	rec := do(t, New(f, Options{}), "POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000}`)
	if got := rec.Header().Get(headerIndex); got != "43" {
		t.Errorf("%s = %q, want 43", headerIndex, got)
	}
}

type advancingNode struct{ *fakeNode }

func (a *advancingNode) Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, bool, error) {
	a.index.Add(1)
	return a.fakeNode.Acquire(ctx, req)
}

func TestReadyzNotReady(t *testing.T) {
	f := newFake()
	f.readyErr = &wire.Error{Code: wire.CodeNoLeader, Message: "no leader is known"}
	rec := do(t, New(f, Options{}), "GET", "/readyz", "")
	wantError(t, rec, 503, wire.CodeNoLeader, "")
	if rec.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}

	f.readyErr = errors.New("catching up")
	rec = do(t, New(f, Options{}), "GET", "/readyz", "")
	wantError(t, rec, 503, wire.CodeUnavailable, "")
}

func TestUnknownRouteAndMethod(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	rec := do(t, h, "GET", "/v1/nothing", "")
	wantError(t, rec, 404, wire.CodeNotFound, "")
	if rec.Header().Get(headerIndex) == "" {
		t.Errorf("404 without %s", headerIndex)
	}
	rec = do(t, h, "PUT", "/v1/leases/ls_1", "")
	wantError(t, rec, 405, wire.CodeMethodNotAllowed, "")
	if allow := rec.Header().Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "DELETE") {
		t.Errorf("Allow = %q", allow)
	}
	rec = do(t, h, "GET", "/v1/leases/", "")
	wantError(t, rec, 404, wire.CodeNotFound, "")
	if len(f.called()) != 0 {
		t.Errorf("unrouted requests reached the node: %v", f.called())
	}
}

// TestBadRequests: malformed input is 400 (or 413) and never reaches the
// node.
func TestBadRequests(t *testing.T) {
	big := `{"key":"k","holder":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`
	tests := []struct {
		name         string
		method, path string
		body         string
		hdr          []string
		status       int
		code         wire.Code
		field        string
	}{
		{"over 64 KiB", "POST", "/v1/leases", big, nil, 413, wire.CodePayloadTooLarge, ""},
		{"over 64 KiB garbage", "POST", "/v1/sessions", strings.Repeat("{", DefaultMaxBodyBytes+1), nil, 413, wire.CodePayloadTooLarge, ""},
		{"over 64 KiB trailing", "POST", "/v1/validate", `{"key":"k"}` + strings.Repeat(" ", DefaultMaxBodyBytes), nil, 413, wire.CodePayloadTooLarge, ""},
		{"unknown field", "POST", "/v1/leases", `{"key":"k","holder":"h","ttl":5}`, nil, 400, wire.CodeInvalidArgument, "ttl"},
		{"unknown nested field", "POST", "/v1/heartbeat", `{"leases":[{"lease_id":"a","tok":"b"}]}`, nil, 400, wire.CodeInvalidArgument, "tok"},
		{"session token in body", "POST", "/v1/leases", `{"key":"k","holder":"h","session_token":"x"}`, nil, 400, wire.CodeInvalidArgument, "session_token"},
		{"malformed", "POST", "/v1/leases", `{"key":`, nil, 400, wire.CodeInvalidArgument, ""},
		{"syntax", "POST", "/v1/leases", `{"key" "k"}`, nil, 400, wire.CodeInvalidArgument, ""},
		{"trailing data", "POST", "/v1/leases", `{"key":"k"} {"key":"j"}`, nil, 400, wire.CodeInvalidArgument, ""},
		{"trailing garbage", "POST", "/v1/validate", `{"key":"k"}x`, nil, 400, wire.CodeInvalidArgument, ""},
		{"not an object", "POST", "/v1/leases", `["k"]`, nil, 400, wire.CodeInvalidArgument, ""},
		{"wrong type", "POST", "/v1/leases", `{"key":"k","ttl_ms":"5s"}`, nil, 400, wire.CodeInvalidArgument, "ttl_ms"},
		{"negative limit", "POST", "/v1/leases", `{"key":"k","limit":-1}`, nil, 400, wire.CodeInvalidArgument, "limit"},
		{"huge limit", "POST", "/v1/leases", `{"key":"k","limit":4294967296}`, nil, 400, wire.CodeInvalidArgument, "limit"},
		{"metadata not strings", "POST", "/v1/sessions", `{"holder":"h","metadata":{"a":1}}`, nil, 400, wire.CodeInvalidArgument, "metadata"},
		{"empty body", "POST", "/v1/leases", ``, nil, 400, wire.CodeInvalidArgument, ""},
		{"empty heartbeat body", "POST", "/v1/heartbeat", ``, nil, 400, wire.CodeInvalidArgument, ""},
		{"renew without token", "POST", "/v1/leases/ls_1/renew", `{}`, nil, 400, wire.CodeInvalidArgument, "X-Lease-Token"},
		{"renew bad body", "POST", "/v1/leases/ls_1/renew", `{"ttl":1}`, []string{"X-Lease-Token", "t"}, 400, wire.CodeInvalidArgument, "ttl"},
		{"release without token", "DELETE", "/v1/leases/ls_1", ``, nil, 400, wire.CodeInvalidArgument, "X-Lease-Token"},
		{"release bad body", "DELETE", "/v1/leases/ls_1", `{"why":"x"}`, []string{"X-Lease-Token", "t"}, 400, wire.CodeInvalidArgument, "why"},
		{"session heartbeat without token", "POST", "/v1/sessions/ss_1/heartbeat", ``, nil, 400, wire.CodeInvalidArgument, "X-Session-Token"},
		{"bad stale", "GET", "/v1/leases/ls_1?stale=maybe", ``, nil, 400, wire.CodeInvalidArgument, "stale"},
		{"bad limit", "GET", "/v1/leases?limit=ten", ``, nil, 400, wire.CodeInvalidArgument, "limit"},
		{"negative list limit", "GET", "/v1/sessions?limit=-1", ``, nil, 400, wire.CodeInvalidArgument, "limit"},
		{"bad query", "GET", "/v1/leases?key=%zz", ``, nil, 400, wire.CodeInvalidArgument, ""},
		{"transfer bad body", "POST", "/v1/cluster/transfer-leadership", `{"node":"n2"}`, nil, 400, wire.CodeInvalidArgument, "node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			rec := do(t, New(f, Options{}), tt.method, tt.path, tt.body, tt.hdr...)
			wantError(t, rec, tt.status, tt.code, tt.field)
			if rec.Header().Get(headerIndex) == "" {
				t.Errorf("error answer without %s", headerIndex)
			}
			if cs := f.called(); len(cs) != 0 {
				t.Errorf("a rejected request reached the node: %v", cs)
			}
		})
	}
}

func TestBodyLimitOption(t *testing.T) {
	f := newFake()
	h := New(f, Options{MaxBodyBytes: 64})
	body := `{"key":"k","holder":"` + strings.Repeat("h", 64) + `"}`
	wantError(t, do(t, h, "POST", "/v1/leases", body), 413, wire.CodePayloadTooLarge, "")
	rec := do(t, h, "POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000}`)
	if rec.Code != 201 {
		t.Fatalf("small body: status %d", rec.Code)
	}
	// Exactly at the limit is accepted.
	exact := `{"key":"k","holder":"` + strings.Repeat("h", DefaultMaxBodyBytes-23) + `"}`
	if len(exact) != DefaultMaxBodyBytes {
		t.Fatalf("test body is %d bytes", len(exact))
	}
	if rec := do(t, New(f, Options{}), "POST", "/v1/leases", exact); rec.Code != 201 {
		t.Fatalf("body of exactly 64 KiB: status %d %s", rec.Code, rec.Body)
	}
}

// TestAnswerEncoding: answers are one JSON object and a newline.
func TestAnswerEncoding(t *testing.T) {
	rec := do(t, New(newFake(), Options{}), "GET", "/v1/leases/ls_1", "")
	if !strings.HasSuffix(rec.Body.String(), "}\n") {
		t.Errorf("body %q does not end with a newline", rec.Body)
	}
	var l wire.Lease
	if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || l.LeaseID != "ls_1" {
		t.Fatalf("lease = %+v, %v", l, err)
	}
}
