package cluster

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// countFSM counts applied commands.
type countFSM struct{ n atomic.Int64 }

func (f *countFSM) Apply(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		f.n.Add(1)
	}
	return nil
}
func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnap{}, nil }
func (f *countFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type nopSnap struct{}

func (nopSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnap) Release()                          {}

func waitLeader(t *testing.T, c *Cluster) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.raft.State() != raft.Leader {
		if time.Now().After(deadline) {
			t.Fatal("no leadership within 10s")
		}
		<-time.After(5 * time.Millisecond)
	}
}

func TestBootstrapOnceAndLeadershipContext(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}
	f := &countFSM{}
	c, err := Open(cfg, f)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan context.Context, 1)
	c.OnLeadership(func(ctx context.Context) { started <- ctx })
	waitLeader(t, c)
	var lctx context.Context
	select {
	case lctx = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("leadership handler not called")
	}
	if err := c.raft.Apply([]byte("x"), time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("leadership context not cancelled on close")
	}

	// Reopen: existing state, so no second bootstrap; the entry is replayed.
	f2 := &countFSM{}
	c2, err := Open(cfg, f2)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitLeader(t, c2)
	if err := c2.raft.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := f2.n.Load(); got != 1 {
		t.Fatalf("replayed %d commands, want 1", got)
	}
	conf := c2.raft.GetConfiguration()
	if err := conf.Error(); err != nil || len(conf.Configuration().Servers) != 1 {
		t.Fatalf("configuration %v %v", conf.Configuration(), err)
	}
}

func TestUnspecifiedAdvertiseRefused(t *testing.T) {
	_, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "0.0.0.0:0", Bootstrap: true}, &countFSM{})
	if err == nil {
		t.Fatal("binding 0.0.0.0 without an advertise address must fail")
	}
}

func TestSecondOpenOfDataDirFailsClearly(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err == nil || !strings.Contains(err.Error(), "another leasehold server") {
		t.Fatalf("second open: %v", err)
	}
}

// TestConfigValidate: Validate names every problem at once, each wrapping
// ErrInvalidConfig; DefaultConfig with an id and a directory is valid.
func TestConfigValidate(t *testing.T) {
	bad := Config{ElectionTimeout: -time.Second, LogStore: "rocks"}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid config: %v", err)
	}
	for _, want := range []string{"node id is required", "data directory is required", "election timeout must not be negative", `raft log store "rocks"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, missing %q", err, want)
		}
	}
	good := DefaultConfig()
	good.NodeID, good.Dir = "n1", t.TempDir()
	if err := good.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if _, err := Open(bad, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open with an invalid config: %v", err)
	}
}

// A single-server cluster campaigns as soon as it opens, new or restarted,
// rather than after a heartbeat timeout (here 30 s, so that only the early
// campaign can make it leader within the test's 15 s).
func TestSingleServerCampaignsAtOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true,
		HeartbeatTimeout: 30 * time.Second, ElectionTimeout: 30 * time.Second, LeaderLeaseTimeout: time.Second}
	for round := range 2 {
		c, err := Open(cfg, &countFSM{})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for c.raft.State() != raft.Leader {
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("open %d: not leader within 15 s of a 30 s heartbeat timeout", round)
			}
			<-time.After(5 * time.Millisecond)
		}
		if got := c.raft.ReloadableConfig().HeartbeatTimeout; got != cfg.HeartbeatTimeout {
			t.Errorf("open %d: heartbeat timeout %v after the campaign, want %v", round, got, cfg.HeartbeatTimeout)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOnlyVoter(t *testing.T) {
	v := func(id string) raft.Server { return raft.Server{ID: raft.ServerID(id), Suffrage: raft.Voter} }
	nv := func(id string) raft.Server { return raft.Server{ID: raft.ServerID(id), Suffrage: raft.Nonvoter} }
	for _, tc := range []struct {
		servers []raft.Server
		want    bool
	}{
		{[]raft.Server{v("a")}, true},
		{[]raft.Server{v("a"), nv("b")}, true},
		{[]raft.Server{v("a"), v("b")}, false},
		{[]raft.Server{v("b")}, false},
		{[]raft.Server{nv("a")}, false},
		{nil, false},
	} {
		if got := onlyVoter(raft.Configuration{Servers: tc.servers}, "a"); got != tc.want {
			t.Errorf("%v: onlyVoter = %v, want %v", tc.servers, got, tc.want)
		}
	}
}
