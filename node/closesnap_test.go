package node

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/wire"
)

// TestCloseSnapshots: a graceful stop with many entries since the last
// snapshot takes one, so that the next start restores it instead of
// replaying the log, and the state is the same after the restart.
func TestCloseSnapshots(t *testing.T) {
	defer func(n uint64) { closeSnapshotMin = n }(closeSnapshotMin)
	closeSnapshotMin = 10
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SnapshotThreshold = 1 << 40 // no automatic snapshot
	cfg.SnapshotInterval = time.Hour
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-n.Ready()
	waitFor(t, 5*time.Second, n.lt.isReady)
	ctx := context.Background()
	var ids []string
	for i := range 20 {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("k", i), Holder: "a", TTLMS: 600000})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.LeaseID)
	}
	applied := n.AppliedIndex()
	n.Close()

	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := snaps.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 || list[0].Index < applied {
		t.Fatalf("snapshots after a graceful stop at index %d: %+v", applied, list)
	}
	_, rc, err := snaps.Open(list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()

	n2 := openNode(t, cfg)
	for _, id := range ids {
		if l, err := n2.GetLease(ctx, id, false); err != nil || l.State != "active" {
			t.Fatalf("lease %s after restart: %v %+v", id, err, l)
		}
	}
}

// TestCloseHandsLeadershipOn: a leader stopping gracefully hands
// leadership to another voter before it takes its snapshot-on-close (it
// accepts no more writes by then), and the others go on writing.
func TestCloseHandsLeadershipOn(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	defer func(n uint64) { closeSnapshotMin = n }(closeSnapshotMin)
	closeSnapshotMin = 1
	var during atomic.Value
	closeSnapshotHook = func(n *Node) {
		if n == l {
			during.Store(n.cl.State())
		}
	}
	defer func() { closeSnapshotHook = nil }()
	ctx := context.Background()
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "before", Holder: "a", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	st, ran := during.Load().(cluster.State)
	if !ran {
		t.Fatal("the stopping server took no snapshot-on-close")
	}
	if st == cluster.Leader {
		t.Fatal("the stopping server was still the leader when it took its snapshot")
	}
	next := c.leader(l.cfg.NodeID)
	if _, _, err := next.Acquire(ctx, wire.AcquireRequest{Key: "after", Holder: "a", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
}
