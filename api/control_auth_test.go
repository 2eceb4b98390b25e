package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// forgedForward is issue 11's reproduction: a client's own control
// operation, sent to the node-to-node route with the forwarding header.
const forgedForward = `{"op":"acquire","acquire":{"holder":"mallory","wsClientId":7,"ttlMs":86400000}}`

// TestControlForwardNotAClientRoute: the control lease's node-to-node
// route is not served on the public listener: a client token of any scope
// that forges the forwarding header gets 404 and takes no lease.
func TestControlForwardNotAClientRoute(t *testing.T) {
	env := newControlEnv(t, Options{Tokens: testTokens(t)})
	for scope, tok := range map[string]string{"read": readToken, "write": writeToken, "admin": adminToken} {
		for _, body := range []string{forgedForward,
			`{"op":"acquire","acquire":{"holder":"mallory","wsClientId":7,"ttlMs":5000}}`} {
			code, b := restDo(t, "POST", env.srv.URL+controlForwardPath, body,
				"Authorization", "Bearer "+tok, headerForwarded, "c2", "Content-Type", "application/json")
			if code != http.StatusNotFound && code != http.StatusForbidden {
				t.Fatalf("forged forward with a %s token: %d %s", scope, code, b)
			}
		}
	}
	st, err := env.n.ControlStatus(context.Background(), false)
	if err != nil || st.Active {
		t.Fatalf("control lease after forged forwards: %+v, %v", st, err)
	}
	// The gate stays open: an admin route answers for itself.
	code, b := restDo(t, "POST", env.srv.URL+"/v1/leases/ls_0000/revoke", `{"reason":"x"}`, "Authorization", "Bearer "+adminToken)
	if code != http.StatusNotFound {
		t.Fatalf("admin route after forged forwards: %d %s", code, b)
	}
}

// TestControlPeerHandlerBounds: the leader's node-to-node handler holds a
// follower's operation to the socket's bounds (TTL cap, heartbeat, body
// size), and the node holds it to its own.
func TestControlPeerHandlerBounds(t *testing.T) {
	env := newControlEnv(t, Options{})
	ctl := NewControl(ControlFromNode(env.n), ControlOptions{})
	h := ctl.PeerHandler()
	post := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", controlForwardPath, strings.NewReader(body))
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, body := range []string{
		forgedForward,
		`{"op":"acquire","acquire":{"holder":"ws_x","ttlMs":60001}}`,
		`{"op":"acquire","acquire":{"holder":"ws_x","ttlMs":999}}`,
		`{"op":"acquire","acquire":{"holder":"ws_x","ttlMs":5000,"heartbeatIntervalMs":-1}}`,
		`{"op":"acquire","acquire":{"holder":"ws_x","clientName":"` + strings.Repeat("n", node.MaxControlNameBytes+1) + `"}}`,
		`{"op":"acquire","acquire":{"holder":"` + strings.Repeat("h", 5000) + `"}}`,
		`{"op":"heartbeat","holder":"ws_x","leaseId":"cl_1","leaseToken":"` + strings.Repeat("t", 200) + `"}`,
	} {
		if code, b := post(body); code < 400 || code >= 500 {
			t.Fatalf("%.80s: %d %s", body, code, b)
		}
	}
	if st, err := env.n.ControlStatus(context.Background(), false); err != nil || st.Active {
		t.Fatalf("control lease after refused operations: %+v, %v", st, err)
	}
	// Within the bounds it is granted.
	code, b := post(`{"op":"acquire","acquire":{"holder":"ws_x","ttlMs":60000}}`)
	if code != http.StatusOK || !strings.Contains(b, `"leaseToken"`) {
		t.Fatalf("acquire within the bounds: %d %s", code, b)
	}
	// Other paths and methods are not served.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", controlForwardPath, nil))
	if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET on the node-to-node route: %d", rec.Code)
	}
}

// TestControlBreak: an admin breaks a control lease whose owner holds it
// (without its token, while the lease gates admin routes); the lease ends
// revoked, its owner and the event stream are told, and the event names
// the admin token (never its secret). A write token cannot break it.
func TestControlBreak(t *testing.T) {
	env := newControlEnv(t, Options{Tokens: testTokens(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sub, err := env.n.Subscribe(ctx, wire.EventFilter{Key: node.ControlKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	w := http.Header{"Authorization": {"Bearer " + writeToken}}
	owner := dialControl(t, env.srv.URL, w)
	l := acquire(t, owner, "stuck", "ttlMs", 60000)

	// Nobody but an admin.
	for scope, tok := range map[string]string{"read": readToken, "write": writeToken} {
		code, b := restDo(t, "POST", env.srv.URL+controlBreakPath, "", "Authorization", "Bearer "+tok)
		if code != 403 || !bytes.Contains(b, []byte(wire.CodePermissionDenied)) {
			t.Fatalf("break with a %s token: %d %s", scope, code, b)
		}
	}
	if code, b := restDo(t, "POST", env.srv.URL+controlBreakPath, ""); code != 401 {
		t.Fatalf("break without a token: %d %s", code, b)
	}
	if st, err := env.n.ControlStatus(ctx, false); err != nil || !st.Active || st.LeaseID != l.LeaseID {
		t.Fatalf("after refused breaks: %+v, %v", st, err)
	}

	code, b := restDo(t, "POST", env.srv.URL+controlBreakPath, "", "Authorization", "Bearer "+adminToken)
	if code != 200 {
		t.Fatalf("admin break: %d %s", code, b)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil || got["active"] != false || got["leaseId"] != l.LeaseID {
		t.Fatalf("admin break answered %s", b)
	}
	if bytes.Contains(b, []byte(l.LeaseToken)) || bytes.Contains(b, []byte(adminToken)) {
		t.Fatalf("break answer carries a secret: %s", b)
	}
	if st, err := env.n.ControlStatus(ctx, false); err != nil || st.Active {
		t.Fatalf("after the break: %+v, %v", st, err)
	}
	owner.changed("revoked")
	var ev wire.Event
	for ev.Type != "revoked" {
		select {
		case ev = <-sub.Events():
		case <-ctx.Done():
			t.Fatal("no revoked event")
		}
	}
	if ev.Lease == nil || ev.Lease.LeaseID != l.LeaseID || ev.Lease.EndReason != node.ControlBreakReason+"ops" {
		t.Fatalf("revoked event = %+v (lease %+v)", ev, ev.Lease)
	}
	evb, _ := json.Marshal(ev)
	if bytes.Contains(evb, []byte(adminToken)) || bytes.Contains(evb, []byte(l.LeaseToken)) {
		t.Fatalf("event carries a secret: %s", evb)
	}
	// The gate is open again; the owner's old token is refused.
	code, b = restDo(t, "POST", env.srv.URL+"/v1/leases/ls_0000/revoke", `{"reason":"x"}`, "Authorization", "Bearer "+adminToken)
	if code != 404 {
		t.Fatalf("admin route after the break: %d %s", code, b)
	}
	wantWSError(t, owner.reply(owner.send(map[string]any{"type": "control.heartbeat", "leaseId": l.LeaseID, "leaseToken": l.LeaseToken})), wire.CodeLeaseInvalid)
	// Nothing to break.
	code, b = restDo(t, "POST", env.srv.URL+controlBreakPath, "", "Authorization", "Bearer "+adminToken)
	restError(t, code, b, 404, wire.CodeLeaseNotFound)
}

// FuzzControlPeerRequest plays a follower (or anything that got past the
// Raft port's checks) to the leader's node-to-node handler: whatever the
// body, it never panics, answers a 4xx for what it refuses, and grants the
// control lease only within the socket's bounds.
func FuzzControlPeerRequest(f *testing.F) {
	for _, s := range []string{
		forgedForward,
		`{"op":"acquire","acquire":{"holder":"ws_1","clientName":"K1","ttlMs":5000,"heartbeatIntervalMs":1000}}`,
		`{"op":"acquire","acquire":{"holder":"ws_1","ttlMs":60000}}`,
		`{"op":"acquire","acquire":{"holder":"ws_1","ttlMs":60001}}`,
		`{"op":"acquire","acquire":{"holder":"ws_1","ttlMs":-1,"heartbeatIntervalMs":-5}}`,
		`{"op":"acquire","acquire":{"holder":"ws_1","leaseId":"ls_1","leaseToken":"x"}}`,
		`{"op":"acquire"}`, `{"op":"heartbeat","holder":"ws_1","leaseId":"cl_1","leaseToken":"t"}`,
		`{"op":"release","holder":"ws_1","leaseId":"cl_1","leaseToken":"t","reason":"owner_disconnected"}`,
		`{"op":"status"}`, `{"op":"x"}`, `{}`, `null`, `[]`, ``, `{"op":"status","extra":1}`,
	} {
		f.Add([]byte(s))
	}
	if testing.Short() {
		f.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.Close() })
	pollUntil(f, 20*time.Second, "the node to be ready", func() bool { return n.ReadyErr() == nil })
	h := NewControl(ControlFromNode(n), ControlOptions{}).PeerHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", controlForwardPath, bytes.NewReader(body)))
		switch {
		case rec.Code == http.StatusOK:
		case rec.Code >= 400 && rec.Code < 500:
		case rec.Code == http.StatusServiceUnavailable || rec.Code == http.StatusGatewayTimeout:
		default:
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := n.ControlStatus(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		if st.Active {
			if int64(st.TTLMS) > DefaultControlMaxTTL.Milliseconds() || int64(st.TTLMS) < node.MinControlTTL.Milliseconds() {
				t.Fatalf("%q granted the control lease for %d ms", body, st.TTLMS)
			}
			if _, err := n.ControlBreak(ctx, "fuzz"); err != nil && wire.ErrorCode(err) != wire.CodeLeaseNotFound {
				t.Fatal(err)
			}
		}
	})
}

// TestControlNotAControlLeaseID: a heartbeat or release naming an id that
// is not a control lease's is LEASE_INVALID on the socket and on the
// node-to-node route (it was 500 INTERNAL: found by FuzzControlPeerRequest).
func TestControlNotAControlLeaseID(t *testing.T) {
	env := newControlEnv(t, Options{})
	a := dialControl(t, env.srv.URL, nil)
	for _, typ := range []string{"control.heartbeat", "control.release"} {
		m := a.reply(a.send(map[string]any{"type": typ, "leaseId": "ls_1", "leaseToken": "t"}))
		wantWSError(t, m, wire.CodeLeaseInvalid)
	}
	h := NewControl(ControlFromNode(env.n), ControlOptions{}).PeerHandler()
	for _, body := range []string{`{"op":"heartbeat"}`, `{"op":"release","holder":"ws_1","leaseId":"ls_1","leaseToken":"t"}`} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", controlForwardPath, strings.NewReader(body)))
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), string(wire.CodeLeaseInvalid)) {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
}
