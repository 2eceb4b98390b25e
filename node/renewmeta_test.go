package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestRenewWithMetadata: a renewal or heartbeat item that carries metadata
// replaces the lease's metadata, seen by GET and listings; metadata past
// its limits is refused (INVALID_ARGUMENT, field metadata) and changes
// nothing; nil metadata leaves it as it is.
func TestRenewWithMetadata(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 5000, Metadata: map[string]string{"shard": "3"}})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"processed": "41"}})
	if err != nil || rl.Metadata["processed"] != "41" || rl.Metadata["shard"] != "" || rl.RenewalCount != 1 {
		t.Fatalf("renew with metadata: %+v, %v", rl, err)
	}
	if g, err := n.GetLease(ctx, l.LeaseID, false); err != nil || g.Metadata["processed"] != "41" {
		t.Fatalf("get: %+v, %v", g, err)
	}
	if _, err := n.Renew(ctx, l.LeaseID, l.Token, 0); err != nil {
		t.Fatal(err)
	}
	big := map[string]string{"x": strings.Repeat("y", 5000)}
	if _, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: big}); wire.ErrorCode(err) != wire.CodeInvalidArgument || err.(*wire.Error).Field != "metadata" {
		t.Fatalf("too large: %v", err)
	}
	res, err := n.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: l.LeaseID, Token: l.Token, Metadata: big}})
	if wire.ErrorCode(err) != wire.CodeInvalidArgument || err.(*wire.Error).Field != "metadata" || !strings.Contains(err.Error(), "leases[0]") {
		t.Fatalf("heartbeat too large: %v, %v", res, err)
	}
	g, err := n.GetLease(ctx, l.LeaseID, false)
	if err != nil || g.Metadata["processed"] != "41" || g.RenewalCount != 2 {
		t.Fatalf("after refusals: %+v, %v", g, err)
	}
	res, err = n.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"processed": "99"}}})
	if err != nil || !res[0].OK {
		t.Fatalf("heartbeat: %+v, %v", res, err)
	}
	list, err := n.ListLeases(ctx, wire.ListRequest{Holder: "w1"}, false)
	if err != nil || len(list.Leases) != 1 || list.Leases[0].Metadata["processed"] != "99" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if _, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if g, err := n.GetLease(ctx, l.LeaseID, false); err != nil || g.Metadata != nil {
		t.Fatalf("after clearing: %+v, %v", g, err)
	}
}

// TestRenewMetadataOlderServer: while a server of the configuration runs a
// version that does not read metadata renewals, one is refused with
// UNAVAILABLE and changes nothing; plain renewals go on.
func TestRenewMetadataOlderServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.olderPeer = true
	n := openNode(t, cfg)
	ctx := context.Background()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 5000, Metadata: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"a": "2"}}); wire.ErrorCode(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "older version") {
		t.Fatalf("renew with metadata: %v", err)
	}
	if _, err := n.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: l.LeaseID, Token: l.Token, Metadata: map[string]string{"a": "2"}}}); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("heartbeat with metadata: %v", err)
	}
	if rl, err := n.Renew(ctx, l.LeaseID, l.Token, 0); err != nil || rl.Metadata["a"] != "1" || rl.RenewalCount != 1 {
		t.Fatalf("plain renew: %+v, %v", rl, err)
	}
}

// TestClusterRenewMetadata: in a cluster of three servers of this version
// (each gossips RenewMeta) a renewal with metadata is accepted and every
// replica applies it.
func TestClusterRenewMetadata(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	var rl *wire.Lease
	waitFor(t, 10*time.Second, func() bool { // until gossip knows every server
		rl, err = l.RenewWith(ctx, wire.RenewRequest{LeaseID: lease.LeaseID, Token: lease.Token, Metadata: map[string]string{"fps": "15"}})
		if err != nil && wire.ErrorCode(err) != wire.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		target := l.AppliedIndex()
		waitFor(t, 10*time.Second, func() bool { return n.AppliedIndex() >= target })
		got, err := n.GetLease(ctx, lease.LeaseID, true)
		if err != nil || got.Metadata["fps"] != "15" || got.RenewalCount != rl.RenewalCount {
			t.Fatalf("%s: %+v, %v", id, got, err)
		}
	}
}
