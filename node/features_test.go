package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// storedEntries records the command entries a server's log store writes.
type storedEntries struct {
	raft.LogStore
	mu   *sync.Mutex
	logs *[]raft.Log
}

func (s storedEntries) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s storedEntries) StoreLogs(logs []*raft.Log) error {
	s.mu.Lock()
	for _, l := range logs {
		if l.Type == raft.LogCommand {
			*s.logs = append(*s.logs, raft.Log{Index: l.Index, Data: append([]byte(nil), l.Data...)})
		}
	}
	s.mu.Unlock()
	return s.LogStore.StoreLogs(logs)
}

// TestFeaturesSurviveADownServer: three servers learn from gossip that all
// read entry checksums, chunked expiry and restores through the log, and
// the leader records that in the state. Then n3 stops, and n4 joins and
// takes the lead: its gossip never saw n3, a server of the configuration.
// It still writes checksummed entries, chunks expiry and takes restores:
// the record says every server reads them. (Before the record, a leader
// that did not know every server from its own gossip, n4 here or a server
// restarted while one was down, wrote every entry without a checksum and
// refused restores and chunked expiry.)
func TestFeaturesSurviveADownServer(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	all := fsm.FeatureEntryCRC | fsm.FeatureChunkedExpiry | fsm.FeatureRestoreLog
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		waitFor(t, 30*time.Second, func() bool { return fsm.Features(n.rep.features.Load()).Has(all) })
	}
	c.stop("n3")
	if l.cfg.NodeID == "n3" {
		l = c.leader("n3")
	}

	var mu sync.Mutex
	var stored []raft.Log
	cfg4 := clusterConfig("n4")
	cfg4.Join = []string{l.mem.Gossip().Addr()}
	cfg4.WrapRaftStores = func(logs raft.LogStore, st raft.StableStore) (raft.LogStore, raft.StableStore) {
		return storedEntries{LogStore: logs, mu: &mu, logs: &stored}, st
	}
	n4 := c.start(cfg4)
	c.voters(4)
	if _, known := n4.mem.Gossip().Peer("n3"); known {
		t.Fatal("n4's gossip knows n3: the test needs a leader that never saw it")
	}
	ctx := context.Background()
	waitFor(t, 60*time.Second, func() bool {
		if cur := c.leader("n3"); cur != n4 {
			cur.TransferLeadership(ctx, "n4")
		}
		return n4.cl.IsLeader() && n4.ReadyErr() == nil
	})
	mu.Lock()
	from := uint64(0)
	if len(stored) > 0 {
		from = stored[len(stored)-1].Index
	}
	mu.Unlock()
	for i := range 5 {
		if _, _, err := n4.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("feat/%d", i), Holder: "w", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	checked, plain := 0, 0
	for _, e := range stored {
		if e.Index <= from {
			continue
		}
		if len(e.Data) > 0 && e.Data[0] == fsm.VersionChecked {
			checked++
		} else {
			plain++
		}
	}
	mu.Unlock()
	if plain > 0 || checked < 5 {
		t.Fatalf("n4 as leader wrote %d entries with a checksum and %d without", checked, plain)
	}
	if n4.tk.tickChunk() == 0 {
		t.Fatal("n4 as leader does not chunk expiry")
	}
	if err := n4.bk.restoreSupported(); err != nil {
		t.Fatalf("n4 as leader refuses restores: %v", err)
	}
}
