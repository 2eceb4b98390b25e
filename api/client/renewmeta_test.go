package client_test

import (
	"context"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// TestRenewWithMetadata: against a real server, RenewWith, heartbeat items
// and keep-alive stream renewals replace the lease's metadata; past the
// limits the server refuses them (INVALID_ARGUMENT, field metadata), and
// a stream renewal too long for a line is refused before it is sent.
func TestRenewWithMetadata(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, stop := exampleServer()
	defer stop()
	c, err := client.New([]string{addr}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "camera/9", Holder: "runner-1", TTLMS: 30_000, Metadata: map[string]string{"site": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := c.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"site": "a", "fps": "15"}})
	if err != nil || rl.Metadata["fps"] != "15" || rl.RenewalCount != 1 {
		t.Fatalf("RenewWith: %+v, %v", rl, err)
	}
	if rl, err := c.Renew(ctx, l.LeaseID, l.Token, 0); err != nil || rl.Metadata["fps"] != "15" {
		t.Fatalf("Renew kept no metadata: %+v, %v", rl, err)
	}
	_, err = c.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"x": strings.Repeat("y", 5000)}})
	if client.ErrorCode(err) != wire.CodeInvalidArgument || !strings.Contains(err.Error(), "metadata") {
		t.Fatalf("too large: %v", err)
	}
	res, err := c.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"fps": "30"}}})
	if err != nil || len(res) != 1 || !res[0].OK {
		t.Fatalf("heartbeat: %+v, %v", res, err)
	}
	if g, err := c.Get(ctx, l.LeaseID); err != nil || len(g.Metadata) != 1 || g.Metadata["fps"] != "30" || g.RenewalCount != 3 {
		t.Fatalf("after heartbeat: %+v, %v", g, err)
	}

	rs, err := c.KeepAliveStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if a, err := rs.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"fps": "25"}}); err != nil || !a.OK {
		t.Fatalf("stream RenewWith: %+v, %v", a, err)
	}
	_, err = rs.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"x": strings.Repeat("\x01", 1000)}})
	if client.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("overlong stream line: %v", err)
	}
	// The stream goes on.
	if a, err := rs.Renew(ctx, l.LeaseID, l.Token, 0); err != nil || !a.OK {
		t.Fatalf("stream Renew: %+v, %v", a, err)
	}
	if g, err := c.Get(ctx, l.LeaseID); err != nil || g.Metadata["fps"] != "25" || g.RenewalCount != 5 {
		t.Fatalf("after the stream: %+v, %v", g, err)
	}
}

// TestSessionHeartbeatWithMetadata: against a real server,
// SessionHeartbeatWith replaces the session's metadata (GetSession shows
// it); nil metadata leaves it; past the limits the server refuses it.
func TestSessionHeartbeatWithMetadata(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, stop := exampleServer()
	defer stop()
	c, err := client.New([]string{addr}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.CreateSession(ctx, wire.SessionRequest{Holder: "worker-1", TTLMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := c.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: map[string]string{"frames": "7"}})
	if err != nil || hb.Metadata["frames"] != "7" || hb.HeartbeatCount != 1 {
		t.Fatalf("SessionHeartbeatWith: %+v, %v", hb, err)
	}
	if _, err := c.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token}); err != nil {
		t.Fatal(err)
	}
	_, err = c.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: map[string]string{"x": strings.Repeat("y", 5000)}})
	if client.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("too large: %v", err)
	}
	if g, err := c.GetSession(ctx, s.SessionID); err != nil || g.Metadata["frames"] != "7" || g.HeartbeatCount != 2 {
		t.Fatalf("GetSession: %+v, %v", g, err)
	}
}
