package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// rotLogs stands for a disk that rotted under the log store: every
// checksummed command entry up to index upTo reads back with one bit
// flipped (0: none).
type rotLogs struct {
	raft.LogStore
	upTo *atomic.Uint64
}

func (s rotLogs) GetLog(index uint64, l *raft.Log) error {
	if err := s.LogStore.GetLog(index, l); err != nil {
		return err
	}
	if index <= s.upTo.Load() && l.Type == raft.LogCommand && len(l.Data) > 8 && l.Data[0] == fsm.VersionChecked {
		d := append([]byte(nil), l.Data...)
		d[len(d)/2] ^= 0x10
		l.Data = d
	}
	return nil
}

// TestBitRotOnLeaderNotReplicated: entries that rotted on the leader's
// disk after it applied them never reach a server that catches up from
// it (which would stop on them): the leader refuses them, takes a fresh
// snapshot, and the new server starts from that and serves the cluster's
// state.
func TestBitRotOnLeaderNotReplicated(t *testing.T) {
	c := newTestCluster(t)
	var rotted atomic.Uint64
	cfg1 := clusterConfig("n1")
	cfg1.WrapRaftStores = func(logs raft.LogStore, st raft.StableStore) (raft.LogStore, raft.StableStore) {
		return rotLogs{LogStore: logs, upTo: &rotted}, st
	}
	n1 := c.start(cfg1)
	<-n1.Ready()
	ctx := context.Background()
	const leases = 40
	for i := range leases {
		if _, _, err := n1.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("rot/%d", i), Holder: "w", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
	}
	rotted.Store(n1.AppliedIndex())
	cfg2 := clusterConfig("n2")
	cfg2.Join = []string{n1.mem.gossip.Addr()}
	n2 := c.start(cfg2)
	waitFor(t, 45*time.Second, func() bool {
		if msg := n2.rep.broken.Load(); msg != nil {
			t.Fatalf("the new server stopped on an entry from the leader's damaged disk: %s", *msg)
		}
		return n2.ReadyErr() == nil && n2.AppliedIndex() >= rotted.Load()
	})
	list, err := n2.ListLeases(ctx, wire.ListRequest{Prefix: "rot/", Limit: 100}, true)
	if err != nil || len(list.Leases) != leases {
		t.Fatalf("the new server's leases: %v, %+v", err, list)
	}
	if got := metricValue(t, n1.rot.refused); got < 1 {
		t.Fatalf("leasehold_log_entries_damaged_total = %v, want >= 1", got)
	}
}
