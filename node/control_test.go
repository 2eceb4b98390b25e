package node

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

func wantCode(t *testing.T, err error, code wire.Code) {
	t.Helper()
	if wire.ErrorCode(err) != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
}

// TestControlLeaseOperations covers the node's control operations: grant
// with defaults, lock-out, refresh, owner check, gate, release, expiry, and
// the public API's refusals.
func TestControlLeaseOperations(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()

	st, err := n.ControlStatus(ctx, false)
	if err != nil || st.Active || st.TTLMS != 5000 || st.HeartbeatIntervalMS != 1000 || st.Scope != "global" {
		t.Fatalf("idle status = %+v, %v", st, err)
	}
	if err := n.ControlCheck("", ""); err != nil {
		t.Fatalf("gate with no control lease: %v", err)
	}

	a, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", ClientName: "K1", WSClientID: 7})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Active || !strings.HasPrefix(a.LeaseID, "cl_") || a.TTLMS != 5000 || a.HeartbeatIntervalMS != 1000 ||
		a.OwnerWSClientID != 7 || a.OwnerClientName != "K1" || a.ExpiresAtMS-a.AcquiredAtMS != 5000 || a.RemainingMS > 5000 || a.Owner != "ws_a" {
		t.Fatalf("acquired = %+v", a)
	}
	if b, err := base64.RawURLEncoding.DecodeString(a.LeaseToken); err != nil || len(b) < 16 {
		t.Fatalf("token %q: %d bytes, %v", a.LeaseToken, len(b), err)
	}

	// Another connection is locked out, with the owner's details.
	_, err = n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_b", ClientName: "other"})
	var ce *ControlError
	if !errors.As(err, &ce) || ce.Err.Code != wire.CodeControlLocked || ce.OwnerClientName != "K1" || ce.RemainingMS <= 0 {
		t.Fatalf("second acquire: %v", err)
	}
	// ... and cannot use the owner's credentials.
	_, err = n.ControlHeartbeat(ctx, "ws_b", a.LeaseID, a.LeaseToken)
	wantCode(t, err, wire.CodeControlLocked)
	_, err = n.ControlRelease(ctx, "ws_b", a.LeaseID, a.LeaseToken, "x")
	wantCode(t, err, wire.CodeControlLocked)
	_, err = n.ControlHeartbeat(ctx, "ws_a", a.LeaseID, "wrong")
	wantCode(t, err, wire.CodeLeaseInvalid)

	// The owner's re-acquire refreshes the same lease: once the countdown
	// has moved by 500 ms, the refresh moves the expiry (a tick, not the
	// countdown the answer renders, which a loaded machine may render
	// several ticks after the write) by at least as much.
	waitFor(t, 10*time.Second, func() bool { s, _ := n.ControlStatus(ctx, true); return s.RemainingMS < 4500 })
	r, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", ClientName: "K1", LeaseID: a.LeaseID, Token: a.LeaseToken})
	if err != nil || r.LeaseID != a.LeaseID || r.LeaseToken != a.LeaseToken || int32(r.ExpiresAtMS-a.ExpiresAtMS) < 500 || r.RemainingMS > 5000 {
		t.Fatalf("refresh = %+v, %v (first grant %+v)", r, err, a)
	}

	// The gate.
	wantCode(t, n.ControlCheck("", ""), wire.CodeLeaseRequired)
	wantCode(t, n.ControlCheck("", "wrong"), wire.CodeLeaseInvalid)
	wantCode(t, n.ControlCheck(a.LeaseID, "wrong"), wire.CodeLeaseInvalid)
	wantCode(t, n.ControlCheck("cl_nope", a.LeaseToken+"x"), wire.CodeLeaseInvalid)
	if err := n.ControlCheck("", a.LeaseToken); err != nil {
		t.Fatalf("gate with the token: %v", err)
	}

	// The public lease API neither grants the key nor touches the lease.
	_, _, err = n.Acquire(ctx, wire.AcquireRequest{Key: ControlKey, Holder: "h", TTLMS: 5000})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = n.Renew(ctx, a.LeaseID, a.LeaseToken, 0)
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = n.Release(ctx, wire.ReleaseRequest{LeaseID: a.LeaseID, Token: a.LeaseToken})
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = n.Revoke(ctx, a.LeaseID, "x")
	wantCode(t, err, wire.CodeInvalidArgument)
	_, err = n.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: a.LeaseID, Token: a.LeaseToken}})
	wantCode(t, err, wire.CodeInvalidArgument)
	if s, _ := n.ControlStatus(ctx, false); !s.Active || s.LeaseID != a.LeaseID {
		t.Fatalf("status after refused calls = %+v", s)
	}

	// Release, then the other connection gets a new lease; the old
	// credentials name another owner now.
	rel, err := n.ControlRelease(ctx, "ws_a", a.LeaseID, a.LeaseToken, "user_exit")
	if err != nil || rel.Active || rel.EndReason != "user_exit" || rel.State != "released" {
		t.Fatalf("release = %+v, %v", rel, err)
	}
	b, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_b", TTLMS: 1000})
	if err != nil || b.LeaseID == a.LeaseID || b.HeartbeatIntervalMS != 333 {
		t.Fatalf("acquire after release = %+v, %v", b, err)
	}
	wantCode(t, n.ControlCheck(a.LeaseID, a.LeaseToken), wire.CodeControlLocked)
	_, err = n.ControlHeartbeat(ctx, "ws_a", a.LeaseID, a.LeaseToken)
	wantCode(t, err, wire.CodeControlLocked)

	// b expires without heartbeats: LEASE_EXPIRED for its owner, and the
	// gate is open again.
	waitFor(t, 10*time.Second, func() bool { s, _ := n.ControlStatus(ctx, true); return !s.Active })
	_, err = n.ControlHeartbeat(ctx, "ws_b", b.LeaseID, b.LeaseToken)
	wantCode(t, err, wire.CodeLeaseExpired)
	if err := n.ControlCheck("", ""); err != nil {
		t.Fatalf("gate after expiry: %v", err)
	}
	// With a new owner, the expired lease's token is LEASE_EXPIRED.
	if _, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_c"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, n.ControlCheck(b.LeaseID, b.LeaseToken), wire.CodeLeaseExpired)
}

// TestControlBadInputChangesNothing: invalid requests are refused before
// anything is proposed.
func TestControlBadInputChangesNothing(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	for _, r := range []ControlAcquireRequest{
		{Holder: ""},
		{Holder: "ws_a", ClientName: strings.Repeat("x", 129)},
		{Holder: "ws_a", ClientInstanceID: "a\nb"},
		{Holder: "ws_a", TTLMS: 10},
		{Holder: "ws_a", TTLMS: 5000, HeartbeatIntervalMS: 4000},
	} {
		if _, err := n.ControlAcquire(ctx, r); wire.ErrorCode(err) != wire.CodeInvalidArgument {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if _, err := n.ControlHeartbeat(ctx, "ws_a", "ls_1", "t"); wire.ErrorCode(err) != wire.CodeLeaseInvalid {
		t.Errorf("heartbeat of a plain lease id: %v", err)
	}
	if _, err := n.ControlRelease(ctx, "ws_a", "cl_1", "", "x"); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Errorf("release without token: %v", err)
	}
	// Only ticks may have been applied meanwhile.
	if s, _ := n.ControlStatus(ctx, true); s.Active {
		t.Fatal("bad input acquired the control lease")
	}
}

// TestControlAcquireBoundsAtApply: the WebSocket's bounds hold where the
// leader grants the control lease, whoever sent the request: a TTL over
// ControlMaxTTL (issue 11: a day), under a second, an oversized token or a
// lease id that is not a control lease's is refused and takes nothing.
func TestControlAcquireBoundsAtApply(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.ControlMaxTTL = 30 * time.Second
	n := openNode(t, cfg)
	ctx := context.Background()
	for _, r := range []ControlAcquireRequest{
		{Holder: "mallory", WSClientID: 7, TTLMS: 86400000},
		{Holder: "ws_a", TTLMS: 30001},
		{Holder: "ws_a", TTLMS: 999},
		{Holder: "ws_a", TTLMS: 5000, LeaseID: "cl_1", Token: strings.Repeat("t", MaxControlTokenBytes+1)},
		{Holder: "ws_a", TTLMS: 5000, LeaseID: "ls_1", Token: "t"},
	} {
		if _, err := n.ControlAcquire(ctx, r); wire.ErrorCode(err) != wire.CodeInvalidArgument {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if _, err := n.ControlHeartbeat(ctx, "ws_a", "cl_1", strings.Repeat("t", MaxControlTokenBytes+1)); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Errorf("heartbeat with an oversized token: %v", err)
	}
	if s, _ := n.ControlStatus(ctx, true); s.Active {
		t.Fatal("an out-of-bounds acquire took the control lease")
	}
	st, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", TTLMS: 30000})
	if err != nil || !st.Active || st.TTLMS != 30000 {
		t.Fatalf("acquire at the bound: %+v, %v", st, err)
	}
}

// TestControlBreakNode: ControlBreak ends the active control lease revoked,
// with the admin's name in its end reason; with none active it is
// LEASE_NOT_FOUND.
func TestControlBreakNode(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	if _, err := n.ControlBreak(ctx, "ops"); wire.ErrorCode(err) != wire.CodeLeaseNotFound {
		t.Fatalf("break with no lease: %v", err)
	}
	a, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", TTLMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	st, err := n.ControlBreak(ctx, "ops\nteam")
	if err != nil || st.Active || st.LeaseID != a.LeaseID || st.State != "revoked" || !strings.HasPrefix(st.EndReason, ControlBreakReason) ||
		!strings.Contains(st.EndReason, "ops") {
		t.Fatalf("break: %+v, %v", st, err)
	}
	if s, _ := n.ControlStatus(ctx, false); s.Active {
		t.Fatal("the control lease is still active after the break")
	}
	if err := n.ControlCheck("", ""); err != nil {
		t.Fatalf("gate after the break: %v", err)
	}
}

// TestClusterControlLeaseSurvivesFailover: the control lease granted on the
// leader keeps its id, token and countdown on the next leader; a follower
// refuses to propose (NO_LEADER) and the API forwards for it.
func TestClusterControlLeaseSurvivesFailover(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	ctx := context.Background()
	var f *Node
	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			f = n
			break
		}
	}
	_, err := f.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_f"})
	wantCode(t, err, wire.CodeNoLeader)
	st, err := l.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", ClientName: "K1", TTLMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	// Every replica sees it.
	waitFor(t, 10*time.Second, func() bool {
		s, _ := f.ControlStatus(ctx, true)
		return s.Active && s.LeaseID == st.LeaseID
	})
	before, _ := l.ControlStatus(ctx, false)
	c.stop(l.cfg.NodeID)
	nl := c.leader(l.cfg.NodeID)
	s, err := nl.ControlStatus(ctx, false)
	if err != nil || !s.Active || s.LeaseID != st.LeaseID || s.OwnerClientName != "K1" {
		t.Fatalf("status on the new leader = %+v, %v", s, err)
	}
	if s.RemainingMS > before.RemainingMS+uint32(nl.tk.period().Milliseconds()) {
		t.Fatalf("remaining %d on the new leader, %d before: reset", s.RemainingMS, before.RemainingMS)
	}
	// The owner's token still works on the new leader, and the gate knows it.
	if _, err := nl.ControlHeartbeat(ctx, "ws_a", st.LeaseID, st.LeaseToken); err != nil {
		t.Fatalf("heartbeat on the new leader: %v", err)
	}
	if err := nl.ControlCheck("", st.LeaseToken); err != nil {
		t.Fatalf("gate on the new leader: %v", err)
	}
}

// TestControlCountdownZeroIsExpired: once a control lease's countdown
// reaches zero it is expired for the gate and for heartbeats, even before
// the expiry commits (within two ticks), and its owner's re-acquire gets a
// new lease rather than being locked out by its own.
func TestControlCountdownZeroIsExpired(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.TickPeriod = 500 * time.Millisecond // a wide window between zero and expiry
	n := openNode(t, cfg)
	ctx := context.Background()
	a, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", TTLMS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		s, _ := n.ControlStatus(ctx, true)
		return s.Active && s.RemainingMS == 0
	})
	// Still active in the state machine: the window this test is about.
	if n.rep.lookupActive(a.LeaseID) == nil {
		t.Skip("the expiry committed before the checks could run (machine too slow for the window)")
	}
	wantCode(t, n.ControlCheck("", a.LeaseToken), wire.CodeLeaseExpired)
	_, err = n.ControlHeartbeat(ctx, "ws_a", a.LeaseID, a.LeaseToken)
	wantCode(t, err, wire.CodeLeaseExpired)
	b, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", LeaseID: a.LeaseID, Token: a.LeaseToken})
	if err != nil || b.LeaseID == a.LeaseID || !b.Active {
		t.Fatalf("re-acquire at zero = %+v, %v", b, err)
	}
	n.rep.mu.RLock()
	old := n.rep.f.Lease(a.LeaseID)
	n.rep.mu.RUnlock()
	if old.State.String() != "released" || old.EndReason() != ReasonTimedOut {
		t.Fatalf("the timed-out lease ended as %s (%s)", old.State, old.EndReason())
	}
}
