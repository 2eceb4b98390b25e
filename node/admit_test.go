package node

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// TestAdmitPeerRecordedFeatures: for each feature, once the state records
// it, a new server that announces every gossip flag but that feature's is
// refused with a reason naming the feature and "upgrade it"; one that
// announces them all is admitted, and so is one without the flag while the
// feature is not recorded.
func TestAdmitPeerRecordedFeatures(t *testing.T) {
	n := &Node{gk: &grantKeys{}, rep: newReplica(newHub(100), newCounters(), nil)}
	all := cluster.Peer{Meta: n.gossipMeta()}
	all.ID, all.Version = "new", "2"
	var every fsm.Features
	for _, f := range featureFlags {
		every |= f.bit
	}
	for _, f := range featureFlags {
		// lacking is every flag but the feature's own: the one flag
		// whose clearing alone makes the peer not read it.
		lacking := all
		lacking.ID, lacking.Version = "old", "1"
		v := reflect.ValueOf(&lacking.Meta).Elem()
		for i := range v.NumField() {
			p := all
			if fld := reflect.ValueOf(&p.Meta).Elem().Field(i); fld.Kind() == reflect.Bool {
				fld.SetBool(false)
			} else {
				continue
			}
			if !f.has(p) {
				v.Field(i).SetBool(false)
			}
		}
		if f.has(lacking) {
			t.Fatalf("%s: could not build a peer without its flag", f.name)
		}
		n.rep.features.Store(uint64(every &^ f.bit))
		if err := admitPeer(n.recorded, lacking); err != nil {
			t.Errorf("%s not recorded: a server without its flag refused: %v", f.name, err)
		}
		n.rep.features.Store(uint64(f.bit))
		err := admitPeer(n.recorded, lacking)
		if err == nil || !strings.Contains(err.Error(), f.name) || !strings.Contains(err.Error(), "upgrade it") ||
			!strings.Contains(err.Error(), "server old") {
			t.Errorf("%s recorded: a server without its flag: %v, want a refusal naming it and \"upgrade it\"", f.name, err)
		}
		if err := admitPeer(n.recorded, all); err != nil {
			t.Errorf("%s recorded: a server with every flag refused: %v", f.name, err)
		}
	}
}

// TestLeaderRefusesServerLackingRecordedFeature: once the state records a
// feature, the leader does not add a new server whose gossip lacks its
// flag (it is neither recorded nor added; cluster status shows it
// refused, with the reason), and adds one that has every flag. The server
// lacking the flag is in gossip before the other and its id sorts first,
// and a pass takes new servers in id order: by the time the other is in
// the configuration, a pass has decided on it, whatever the timing.
func TestLeaderRefusesServerLackingRecordedFeature(t *testing.T) {
	cfg := clusterConfig("n1")
	n := openNode(t, cfg)
	waitFor(t, 10*time.Second, func() bool { return n.recorded(fsm.FeatureChunkedPrune) })

	join := func(id, raft string, meta cluster.Meta) {
		t.Helper()
		meta.ID, meta.Raft, meta.Incarnation = id, raft, "dir-"+id
		g, err := cluster.StartGossip(cluster.GossipConfig{Name: id, BindAddr: "127.0.0.1:0", Fast: true,
			Meta: func() cluster.Meta { return meta }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		if _, err := g.Join([]string{n.mem.Gossip().Addr()}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, func() bool { p, ok := n.mem.Gossip().Peer(id); return ok && p.Status == "alive" })
	}
	old := n.gossipMeta()
	old.ChunkedPrune, old.Version = false, "older"
	join("a-old", "127.0.0.1:1", old)
	join("b-new", "127.0.0.1:2", n.gossipMeta())

	inConf := func(id string) bool {
		conf, err := n.cl.Configuration()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range conf.Servers {
			if s.ID == id {
				return true
			}
		}
		return false
	}
	waitFor(t, 20*time.Second, func() bool { return inConf("b-new") })
	if inConf("a-old") {
		t.Fatal("a server lacking a recorded feature's flag was added")
	}
	if rec, ok := n.rc.memberRecord("a-old"); ok {
		t.Fatalf("a server lacking a recorded feature's flag was recorded: %+v", rec)
	}
	st, err := n.ClusterStatus(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range st.Members {
		if m.ID == "a-old" {
			found = true
			if m.Health != "refused" || !strings.Contains(m.Reason, "chunked pruning") || !strings.Contains(m.Reason, "upgrade it") {
				t.Errorf("the refused server in cluster status: %+v", m)
			}
		}
	}
	if !found {
		t.Errorf("the refused server is not in cluster status: %+v", st.Members)
	}
}
