package node

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/wire"
)

// stallableLog is a Raft log store whose appends block while stalled: the
// server's Raft loop then hangs in its first append, as on a stuck disk.
type stallableLog struct {
	raft.LogStore
	mu      sync.Mutex
	stalled chan struct{} // closed to release; nil when not stalled
}

func (s *stallableLog) wait() {
	s.mu.Lock()
	ch := s.stalled
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (s *stallableLog) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled == nil {
		s.stalled = make(chan struct{})
	}
}

func (s *stallableLog) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled != nil {
		close(s.stalled)
		s.stalled = nil
	}
}

func (s *stallableLog) StoreLog(l *raft.Log) error {
	s.wait()
	return s.LogStore.StoreLog(l)
}

func (s *stallableLog) StoreLogs(ls []*raft.Log) error {
	s.wait()
	return s.LogStore.StoreLogs(ls)
}

// TestReadyzFrozenFollower: a follower whose log takes no more appends (its
// applied index stands still while the leader's cluster goes on) turns
// unready, saying why, and counts in the stall gauge; it is ready again once
// it catches up.
func TestReadyzFrozenFollower(t *testing.T) {
	c := newTestCluster(t)
	logs := map[string]*stallableLog{}
	var mu sync.Mutex
	open := func(id string, join string) {
		cfg := clusterConfig(id)
		cfg.ApplyStallTimeout = 2 * time.Second
		if join != "" {
			cfg.Join = []string{join}
		}
		cfg.WrapRaftStores = func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
			sl := &stallableLog{LogStore: l}
			mu.Lock()
			logs[id] = sl
			mu.Unlock()
			return sl, s
		}
		c.start(cfg)
	}
	open("n1", "")
	<-c.node("n1").Ready()
	for _, id := range []string{"n2", "n3"} {
		open(id, c.node("n1").mem.Gossip().Addr())
	}
	c.voters(3)
	// Released before the nodes close (cleanups run last first).
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range logs {
			l.release()
		}
	})
	leader := c.leader()
	var f *Node
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != leader.cfg.NodeID {
			f = c.node(id)
			break
		}
	}
	waitFor(t, 30*time.Second, func() bool { return f.ReadyErr() == nil })
	mu.Lock()
	fl := logs[f.cfg.NodeID]
	mu.Unlock()
	fl.stall()
	var reason string
	for deadline := time.Now().Add(60 * time.Second); ; {
		err := f.ReadyErr()
		reason = fmt.Sprint(err)
		if err != nil && strings.Contains(reason, "has not advanced") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("frozen follower %s not unready for its stall within 60s: ReadyErr %s", f.cfg.NodeID, reason)
		}
		<-time.After(10 * time.Millisecond)
	}
	t.Logf("frozen follower %s: %s", f.cfg.NodeID, reason)
	if g := gaugeValue(t, f, "leasehold_apply_stalled"); g != 1 {
		t.Errorf("leasehold_apply_stalled = %v on the frozen follower, want 1", g)
	}
	if g := gaugeValue(t, leader, "leasehold_apply_stalled"); g != 0 {
		t.Errorf("leasehold_apply_stalled = %v on the leader, want 0", g)
	}
	// The cluster goes on without it.
	if _, _, err := leader.Acquire(t.Context(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	fl.release()
	waitFor(t, 60*time.Second, func() bool { return f.ReadyErr() == nil })
	if g := gaugeValue(t, f, "leasehold_apply_stalled"); g != 0 {
		t.Errorf("leasehold_apply_stalled = %v after catching up, want 0", g)
	}
}

// gaugeValue reads a gauge from a node's registry (-1 when it has none).
func gaugeValue(t *testing.T, n *Node, name string) float64 {
	t.Helper()
	mfs, err := n.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestStallReason: the evidence that makes a follower whose applied index
// stands still frozen, each alone, and what does not.
func TestStallReason(t *testing.T) {
	const timeout = 5 * time.Second
	healthy := stallView{stalled: 6 * time.Second, applied: 100, commit: 100, lastIndex: 100, leader: "n1",
		contact: 50 * time.Millisecond, leaderIndex: 100, leaderIndexOK: true}
	for _, c := range []struct {
		name string
		edit func(*stallView)
		want string // a part of the reason; "" for none
	}{
		{"the whole cluster stands still", func(*stallView) {}, ""},
		{"applied recently", func(v *stallView) { v.stalled, v.commit = time.Second, 120 }, ""},
		{"no leader", func(v *stallView) { v.leader, v.commit = "", 120 }, ""},
		{"commit ahead", func(v *stallView) { v.commit = 120 }, "state machine does not apply"},
		{"no contact", func(v *stallView) { v.contact = 6 * time.Second }, "Raft loop does not run"},
		{"never any contact", func(v *stallView) { v.contact = -1 }, "Raft loop does not run"},
		{"leader's log ahead (heartbeats still answered)", func(v *stallView) { v.leaderIndex = 180 }, "its log takes no appends"},
		{"leader's log ahead, unknown", func(v *stallView) { v.leaderIndex, v.leaderIndexOK = 180, false }, ""},
	} {
		v := healthy
		c.edit(&v)
		got := stallReason(v, timeout)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
		if c.want != "" && !strings.Contains(got, "has not advanced") {
			t.Errorf("%s: %q does not say the applied index stands still", c.name, got)
		}
	}
}
