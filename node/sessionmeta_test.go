package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestSessionHeartbeatWithMetadata: a session heartbeat that carries
// metadata (a worker's statistics) replaces the session's metadata, seen
// by GET and listings; metadata past its limits is refused
// (INVALID_ARGUMENT, field metadata) and changes nothing; nil leaves it.
func TestSessionHeartbeatWithMetadata(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	s, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "w1", TTLMS: 5000, Metadata: map[string]string{"role": "worker"}})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token,
		Metadata: map[string]string{"frames": "1200", "shards": "2"}})
	if err != nil || hb.Metadata["frames"] != "1200" || hb.Metadata["role"] != "" || hb.HeartbeatCount != 1 {
		t.Fatalf("heartbeat with metadata: %+v, %v", hb, err)
	}
	if g, err := n.GetSession(ctx, s.SessionID, false); err != nil || g.Metadata["shards"] != "2" || len(g.Metadata) != 2 {
		t.Fatalf("get: %+v, %v", g, err)
	}
	if _, err := n.SessionHeartbeat(ctx, s.SessionID, s.Token); err != nil {
		t.Fatal(err)
	}
	big := map[string]string{"x": strings.Repeat("y", 5000)}
	if _, err := n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: big}); wire.ErrorCode(err) != wire.CodeInvalidArgument || err.(*wire.Error).Field != "metadata" {
		t.Fatalf("too large: %v", err)
	}
	if _, err := n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: "wrong", Metadata: map[string]string{"a": "b"}}); wire.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("wrong token: %v", err)
	}
	list, err := n.ListSessions(ctx, "w1", "", 10, false)
	if err != nil || len(list.Sessions) != 1 || list.Sessions[0].Metadata["frames"] != "1200" || list.Sessions[0].HeartbeatCount != 2 {
		t.Fatalf("list after refusals: %+v, %v", list, err)
	}
	if _, err := n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if g, err := n.GetSession(ctx, s.SessionID, false); err != nil || g.Metadata != nil {
		t.Fatalf("after clearing: %+v, %v", g, err)
	}
}

// TestSessionMetadataOlderServer: while a server of the configuration runs
// a version that does not read session heartbeats with metadata, one is
// refused with UNAVAILABLE and changes nothing; plain heartbeats go on.
func TestSessionMetadataOlderServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.olderPeer = true
	n := openNode(t, cfg)
	ctx := context.Background()
	s, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "w1", TTLMS: 5000, Metadata: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: map[string]string{"a": "2"}}); wire.ErrorCode(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "older version") {
		t.Fatalf("heartbeat with metadata: %v", err)
	}
	if g, err := n.SessionHeartbeat(ctx, s.SessionID, s.Token); err != nil || g.Metadata["a"] != "1" || g.HeartbeatCount != 1 {
		t.Fatalf("plain heartbeat: %+v, %v", g, err)
	}
}

// TestClusterSessionMetadata: in a cluster of three servers of this
// version (each gossips SessionMeta) a session heartbeat with metadata is
// accepted and every replica applies it.
func TestClusterSessionMetadata(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	s, err := l.CreateSession(ctx, wire.SessionRequest{Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	var hb *wire.Session
	waitFor(t, 10*time.Second, func() bool { // until gossip knows every server
		hb, err = l.SessionHeartbeatWith(ctx, wire.SessionHeartbeatRequest{SessionID: s.SessionID, Token: s.Token, Metadata: map[string]string{"fps": "15"}})
		if err != nil && wire.ErrorCode(err) != wire.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		target := l.AppliedIndex()
		waitFor(t, 10*time.Second, func() bool { return n.AppliedIndex() >= target })
		got, err := n.GetSession(ctx, s.SessionID, true)
		if err != nil || got.Metadata["fps"] != "15" || got.HeartbeatCount != hb.HeartbeatCount {
			t.Fatalf("%s: %+v, %v", id, got, err)
		}
	}
}
