package node

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// These tests pin the properties the chaos suite's node canaries break
// (build tags canary_stale_read, canary_tick_at_once): each fails when its
// canary is compiled in.

// TestLinearizableReadNeverLocal: a node that cannot confirm it leads
// answers a linearizable read with NO_LEADER, never from its own state,
// which may be stale: here a follower cut off from the leader, which has
// not seen a lease granted since.
func TestLinearizableReadNeverLocal(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	var f *Node
	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			f = n
			break
		}
	}
	c.isolate(f.cfg.NodeID)
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "stale/1", Holder: "w", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := l.GetLease(ctx, lease.LeaseID, false); err != nil || got.FencingToken != lease.FencingToken {
		t.Fatalf("leader's linearizable read: %v %+v", err, got)
	}
	got, err := f.GetLease(ctx, lease.LeaseID, false)
	if wire.ErrorCode(err) != wire.CodeNoLeader {
		t.Fatalf("cut-off follower answered a linearizable read: %+v, %v; want NO_LEADER", got, err)
	}
	v, err := f.Validate(ctx, wire.ValidateRequest{Key: "stale/1", FencingToken: lease.FencingToken})
	if wire.ErrorCode(err) != wire.CodeNoLeader {
		t.Fatalf("cut-off follower answered a validation: %+v, %v; want NO_LEADER", v, err)
	}
	// A stale read is allowed, and is indeed stale.
	if _, err := f.GetLease(ctx, lease.LeaseID, true); wire.ErrorCode(err) != wire.CodeLeaseNotFound {
		t.Fatalf("stale read on the cut-off follower: %v; want LEASE_NOT_FOUND", err)
	}
}

// TestNewLeaderWaitsOnePeriod: a leader elected in a cluster that has
// ticked waits one tick period before its first tick (only a new cluster
// ticks at once). With a 10 s period the restarted node's tick must not move
// for the 1.5 s the test watches after it leads again (watched from when
// openNode returns, which a loaded machine may delay by seconds after the
// election: the period leaves 8.5 s for that).
func TestNewLeaderWaitsOnePeriod(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.TickPeriod = 10 * time.Second
	cfg.GossipAddr = "127.0.0.1:0" // not the default port, which another process may hold
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Ready(): // a new cluster ticks at once: tick 1
	case <-time.After(10 * time.Second):
		n.Close()
		t.Fatal("node not ready within 10s")
	}
	ticked := func(n *Node) uint64 {
		n.rep.mu.RLock()
		defer n.rep.mu.RUnlock()
		return n.rep.f.Tick()
	}
	before := ticked(n)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Fatal("no tick recorded before the restart")
	}
	n = openNode(t, cfg)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := ticked(n); got != before {
			t.Fatalf("the re-elected leader ticked from %d to %d within 1.5 s of leading; the period is 10 s", before, got)
		}
		<-time.After(5 * time.Millisecond)
	}
}
