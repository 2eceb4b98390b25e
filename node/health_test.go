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
	var hold, held atomic.Bool
	cfg := testConfig(t, "")
	cfg.TickPeriod = time.Second
	cfg.holdClock = func(*replica) bool {
		h := hold.Load()
		if h {
			held.Store(true)
		}
		return h
	}
	n := openNode(t, cfg)
	waitFor(t, 20*time.Second, func() bool { return n.rep.tick.Load() > 0 })
	hold.Store(true)
	// The tick loop has seen the hold (so the tick it proposed last has
	// returned: it was applied), and every committed entry has applied. A
	// tick in flight when the hold was set used to commit after the first
	// barrier and close the gap the test needs.
	waitFor(t, 20*time.Second, func() bool { return held.Load() && n.AppliedIndex() >= n.cl.CommitIndex() })
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

// TestStateCheckSplitRaisesAlarm: two servers whose states differ while
// the third is down: no majority shares a hash, nobody can be told it is
// the odd one, and the check says so: the split outcome is counted (an
// alert's metric), not filed as merely incomplete.
func TestStateCheckSplitRaisesAlarm(t *testing.T) {
	var skewOn atomic.Bool
	c := checkCluster(t, &skewOn)
	ctx := context.Background()
	l := c.leader()
	if l.cfg.NodeID == "n3" {
		l.TransferLeadership(ctx, "")
		l = c.leader("n3")
	}
	for _, id := range []string{"n1", "n2"} {
		if id != l.cfg.NodeID {
			c.stop(id)
		}
	}
	skewOn.Store(true)
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "diverge-me", Holder: "w", TTLMS: 600000}); err != nil {
		t.Fatal(err)
	}
	var res *stateCheckResult
	waitFor(t, 60*time.Second, func() bool {
		res = l.sc.checkStates(ctx)
		return res != nil && len(res.sums) == 2 && len(uniqueSums(res.sums)) == 2
	})
	if res.majority != "" || len(res.odd) != 0 {
		t.Fatalf("a split check found a majority or an odd one: %+v", res)
	}
	if got := metricValue(t, l.sc.metrics.checks.WithLabelValues("split")); got < 1 {
		t.Fatalf("split checks counted: %v", got)
	}
	if l.sc.diverged.Load() != nil || c.node("n3").sc.diverged.Load() != nil {
		t.Fatal("a split check took a server out of service")
	}
}

// TestStateCheckCompletesWithSlowTicks: with a tick period of 2.5 s an
// idle cluster's log grows by one entry per period, and the check's index
// (8 entries ahead) comes 20 s later: the check must wait for it, not
// give up after a fixed 15 s.
func TestStateCheckCompletesWithSlowTicks(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside the other parallel tests
	var skewOn atomic.Bool
	c := checkCluster(t, &skewOn, func(cfg *Config) { cfg.TickPeriod = 2500 * time.Millisecond })
	l := c.leader()
	for _, id := range []string{"n1", "n2", "n3"} {
		waitFor(t, 60*time.Second, func() bool { n := c.node(id); return n.AppliedIndex() >= l.AppliedIndex() })
	}
	res := l.sc.checkStates(context.Background())
	if res == nil || res.majority == "" || len(res.sums) != 3 || len(uniqueSums(res.sums)) != 1 {
		t.Fatalf("state check at a 2.5 s tick period: %+v", res)
	}
}
