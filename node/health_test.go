package node

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/wire"
)

// TestHealthzHungLogWrite: a log write that hangs, rather than fails
// (a stalled disk), makes HealthErr (/healthz) fail once it has hung for
// the threshold, saying so; it is healthy again once the write returns.
func TestHealthzHungLogWrite(t *testing.T) {
	sl := &stallableLog{}
	cfg := testConfig(t, "")
	cfg.logWriteHang = 500 * time.Millisecond
	cfg.WrapRaftStores = func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
		sl.LogStore = l
		return sl, s
	}
	n := openNode(t, cfg)
	t.Cleanup(sl.release) // before the node closes (cleanups run last first)
	if err := n.HealthErr(); err != nil {
		t.Fatalf("healthy node: %v", err)
	}
	sl.stall()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 60000})
	}()
	waitFor(t, 20*time.Second, func() bool { return n.HealthErr() != nil })
	if err := n.HealthErr(); !strings.Contains(err.Error(), "has not returned") {
		t.Fatalf("health of a node whose log write hangs: %v", err)
	}
	if err := n.ReadyErr(); err == nil {
		t.Fatal("ready while its log write hangs")
	}
	sl.release()
	waitFor(t, 20*time.Second, func() bool { return n.HealthErr() == nil })
	<-done
}

// TestReadyAfterBarrierWithSlowTicks: a barrier (a leadership term's, a
// snapshot's) commits an entry the state machine never sees; until the
// next tick the applied index trails the commit index. With a tick period
// longer than readiness waits for the applied index, /readyz failed after
// every barrier; it must not.
func TestReadyAfterBarrierWithSlowTicks(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.TickPeriod = time.Second
	cfg.holdClock = func(*Node) bool { return hold.Load() }
	n := openNode(t, cfg)
	waitFor(t, 20*time.Second, func() bool { return n.rep.tick.Load() > 0 })
	hold.Store(true)
	// The last tick proposed before the hold has applied.
	waitFor(t, 20*time.Second, func() bool { return n.AppliedIndex() >= n.cl.CommitIndex() })
	for i := range 3 {
		if err := n.cl.Barrier(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if c, a := n.cl.CommitIndex(), n.AppliedIndex(); c <= a {
			t.Fatalf("barrier %d: commit index %d, applied %d: the premise (a barrier leaves a gap) does not hold", i, c, a)
		}
		if err := n.ReadyErr(); err != nil {
			t.Fatalf("not ready after barrier %d: %v", i, err)
		}
		if st, why := n.Service(); st != ServiceServing {
			t.Fatalf("service state after barrier %d: %s (%s)", i, st, why)
		}
	}
}
