package cluster

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// memRegistry is a Registry in memory.
type memRegistry struct {
	mu   sync.Mutex
	recs map[string]MemberRecord
}

func (r *memRegistry) Member(id string) (MemberRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.recs[id]
	return rec, ok
}

func (r *memRegistry) Record(_ context.Context, rec MemberRecord) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs[rec.ID] = rec
	return nil
}

func (r *memRegistry) Members() []MemberRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]MemberRecord, 0, len(r.recs))
	for _, rec := range r.recs {
		out = append(out, rec)
	}
	return out
}

// A server that came back at another Raft address with the data directory
// recorded for it, and won an election before any other leader updated its
// address, updates its own entry: no other server will while it leads, and
// once it no longer does the others would dial the address it left.
func TestReconcileUpdatesItsOwnAddress(t *testing.T) {
	c, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitLeader(t, c)
	conf, err := c.Configuration()
	if err != nil {
		t.Fatal(err)
	}
	if len(conf.Servers) != 1 || conf.Servers[0].Address != string(c.Addr) {
		t.Fatalf("bootstrap configuration: %+v (address %s)", conf, c.Addr)
	}

	// Gossip advertises the address the server runs at now.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	moved := l.Addr().String()
	l.Close()
	const inc = "dir-1"
	g := startGossipMeta(t, "a", nil, Meta{ID: "a", Raft: moved, Incarnation: inc, HasState: true})
	if p, ok := g.Peer("a"); !ok || p.Raft != moved || p.Status != "alive" {
		t.Fatalf("gossip's own peer: %+v, %v", p, ok)
	}

	reg := &memRegistry{recs: map[string]MemberRecord{"a": {ID: "a", Incarnation: inc}}}
	m := Membership{Gossip: g, Registry: reg, ClusterID: func() string { return "" }, ApplyTimeout: 10 * time.Second}
	c.Reconcile(context.Background(), conf, m)
	conf, err = c.Configuration()
	if err != nil {
		t.Fatal(err)
	}
	if len(conf.Servers) != 1 || conf.Servers[0].Address != moved || !conf.Servers[0].Voter {
		t.Fatalf("after reconciling: %+v, want a voter at %s", conf, moved)
	}

	// Another data directory under its own id is not this server's to
	// replace: it stays as it is.
	reg.recs["a"] = MemberRecord{ID: "a", Incarnation: "dir-0"}
	c.Reconcile(context.Background(), conf, m)
	if got, _ := c.Configuration(); len(got.Servers) != 1 || got.Servers[0].Address != moved || !got.Servers[0].Voter {
		t.Fatalf("after a mismatched record: %+v", got)
	}
}
