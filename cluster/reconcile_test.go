package cluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
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

// TestReconcileAdmit: a new server that Membership.Admit refuses is
// neither recorded nor added to the configuration, and the refusal is
// logged with its reason; once Admit lets it, the same pass adds it as a
// non-voter.
func TestReconcileAdmit(t *testing.T) {
	var logs syncBuffer
	c, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitLeader(t, c)
	ga := startGossipMeta(t, "a", nil, Meta{ID: "a", Raft: string(c.Addr), Incarnation: "dir-a", HasState: true})
	// b's Raft address takes no connection: a non-voter needs none to be added.
	gb := startGossipMeta(t, "b", nil, Meta{ID: "b", Raft: "127.0.0.1:1", Incarnation: "dir-b", Version: "old"})
	if _, err := gb.Join([]string{ga.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a sees b alive", func() bool { p, ok := ga.Peer("b"); return ok && p.Status == "alive" })

	reg := &memRegistry{recs: map[string]MemberRecord{"a": {ID: "a", Incarnation: "dir-a"}}}
	refusal := errors.New("it does not read chunked pruning, which this cluster records; upgrade it")
	refuse := true
	m := Membership{Gossip: ga, Registry: reg, ClusterID: func() string { return "" }, ApplyTimeout: 10 * time.Second,
		Admit: func(p Peer) error {
			if p.ID == "b" && refuse {
				return refusal
			}
			return nil
		}}
	servers := func() map[string]bool {
		t.Helper()
		conf, err := c.Configuration()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, s := range conf.Servers {
			out[s.ID] = s.Voter
		}
		return out
	}
	for range 2 { // twice: the reason is logged once
		conf, _ := c.Configuration()
		c.Reconcile(context.Background(), conf, m)
	}
	if got := servers(); len(got) != 1 {
		t.Fatalf("refused server added: %v", got)
	}
	if _, ok := reg.Member("b"); ok {
		t.Fatal("refused server recorded in the registry")
	}
	if n := strings.Count(logs.String(), refusal.Error()); n != 1 {
		t.Fatalf("the refusal is logged %d times, want once:\n%s", n, logs.String())
	}

	refuse = false
	conf, _ := c.Configuration()
	c.Reconcile(context.Background(), conf, m)
	if got := servers(); len(got) != 2 || got["b"] {
		t.Fatalf("admitted server: configuration %v, want b as a non-voter", got)
	}
	if rec, ok := reg.Member("b"); !ok || rec.Incarnation != "dir-b" {
		t.Fatalf("admitted server's record: %+v %v", rec, ok)
	}
}

// syncBuffer is a buffer that goroutines may write concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
