package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestAdvertisedNameStaysRaftAddress: an advertise address given as a host
// name is the Raft address the configuration records and peers dial (each
// dial resolves it), not the IP it resolved to at start.
func TestAdvertisedNameStaysRaftAddress(t *testing.T) {
	a, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Advertise: "localhost:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fb := &countFSM{}
	b, err := Open(Config{NodeID: "b", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Advertise: "localhost:0"}, fb)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []*Cluster{a, b} {
		if !strings.HasPrefix(string(c.Addr), "localhost:") || strings.HasSuffix(string(c.Addr), ":0") {
			t.Fatalf("%s advertises %q, want localhost:<its port>", c.cfg.NodeID, c.Addr)
		}
	}
	waitLeader(t, a)
	if err := a.raft.AddVoter("b", raft.ServerAddress(b.Addr), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	conf, err := a.Configuration()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": a.Addr, "b": b.Addr}
	if len(conf.Servers) != 2 {
		t.Fatalf("configuration %+v", conf.Servers)
	}
	for _, s := range conf.Servers {
		if want[s.ID] != s.Address {
			t.Fatalf("configuration %+v, want the names %v", conf.Servers, want)
		}
	}
	// The leader reaches b through the name.
	if err := a.raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for fb.n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b applied nothing within 10s: the leader did not reach it by name")
		}
		<-time.After(5 * time.Millisecond)
	}
}
