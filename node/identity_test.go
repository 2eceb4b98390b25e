package node

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// admitRaft: a server with Raft state takes every connection; one without
// takes none until gossip brought the cluster's view, and none while that
// view lists its id as a member with another data directory.
func TestAdmitRaft(t *testing.T) {
	n := &Node{cfg: Config{NodeID: "n1"}, mem: &membership{incarnation: "new"}}
	n.mem.n = n
	if n.idn == nil {
		n.idn = memIdentity()
	}
	n.idn.n = n
	if err := n.idn.admitRaft("x"); err == nil || !strings.Contains(err.Error(), "not heard") {
		t.Fatalf("no view yet: %v", err)
	}
	if n.gated.Load() == 0 {
		t.Fatal("a refusal did not mark the server gated")
	}
	// A cluster being formed (no identity yet) may ask for votes.
	if err := n.idn.admitRaft(""); err != nil {
		t.Fatalf("a forming cluster: %v", err)
	}
	listed := &clusterView{ClusterID: "x", Servers: []string{"n1", "n2", "n3"},
		Members: []fsm.MemberRecord{{ID: "n1", Incarnation: "old"}, {ID: "n2", Incarnation: "b"}}}
	n.mem.remote = listed
	if err := n.idn.admitRaft("x"); err == nil || !strings.Contains(err.Error(), "another data directory") {
		t.Fatalf("listed with the old data directory: %v", err)
	}
	if err := n.idn.admitRaft("y"); err == nil {
		t.Fatal("a peer of another cluster than gossip's was admitted")
	}
	// The leader removed the old member: not in the configuration.
	n.mem.remote = &clusterView{ClusterID: "x", Servers: []string{"n2", "n3"},
		Members: []fsm.MemberRecord{{ID: "n1", Incarnation: "old", Removed: true}}}
	if err := n.idn.admitRaft("x"); err != nil {
		t.Fatalf("after the removal: %v", err)
	}
	// Added back with this data directory; a cluster without id yet.
	n.mem.remote = &clusterView{Servers: []string{"n1", "n2", "n3"},
		Members: []fsm.MemberRecord{{ID: "n1", Incarnation: "new"}}}
	if err := n.idn.admitRaft(""); err != nil {
		t.Fatalf("added back: %v", err)
	}
	n.mem.remote = listed
	n.hadState.Store(true)
	if err := n.idn.admitRaft("x"); err != nil {
		t.Fatalf("with state: %v", err)
	}
}

// mergeState: a server whose data directory holds cluster y learns from
// gossip that cluster x knows its id, and is refused with what to do; a
// view of another cluster that does not know its id changes nothing.
func TestMergeStateOtherCluster(t *testing.T) {
	n := &Node{cfg: Config{NodeID: "n1"}, mem: &membership{incarnation: "new"}, log: slog.New(slog.DiscardHandler),
		rep: newReplica(newHub(16), newCounters(), func([]fsm.Notice) {}), idn: memIdentity()}
	n.mem.n = n
	if n.idn == nil {
		n.idn = memIdentity()
	}
	n.idn.n = n
	y := "cluster-y"
	n.idn.local.Set(y)
	stranger, _ := json.Marshal(clusterView{ClusterID: "cluster-x", Servers: []string{"a", "b"},
		Members: []fsm.MemberRecord{{ID: "a", Incarnation: "i"}}})
	n.mem.mergeState(stranger, false)
	if err := n.mem.refusedErr(); err != nil {
		t.Fatalf("a cluster that does not know this id: %v", err)
	}
	same, _ := json.Marshal(clusterView{ClusterID: "cluster-y", Servers: []string{"n1"},
		Members: []fsm.MemberRecord{{ID: "n1", Incarnation: "new"}}})
	n.mem.mergeState(same, false)
	if err := n.mem.refusedErr(); err != nil {
		t.Fatalf("its own cluster: %v", err)
	}
	knows, _ := json.Marshal(clusterView{ClusterID: "cluster-x", Servers: []string{"n2", "n3"},
		Members: []fsm.MemberRecord{{ID: "n1", Incarnation: "old", Removed: true}}})
	n.mem.mergeState(knows, false)
	err := n.mem.refusedErr()
	if err == nil || !strings.Contains(err.Error(), "--join") || !strings.Contains(err.Error(), "cluster-x") {
		t.Fatalf("refusal: %v", err)
	}
}

// memIdentity is an identity without a data directory and no id yet.
func memIdentity() *identity {
	l, _ := cluster.OpenLocalID("", nil)
	return &identity{local: l}
}
