package node

import (
	"context"
	"strings"
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
