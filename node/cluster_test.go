package node

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// testCluster runs several in-process nodes: Raft over connected in-memory
// transports (which partition helpers cut), gossip over loopback.
type testCluster struct {
	t     *testing.T
	mu    sync.Mutex
	nodes map[string]*Node
	trans map[string]*raft.InmemTransport
	cut   map[[2]string]bool
}

func clusterConfig(id string) Config {
	cfg := testConfig(nil, "")
	cfg.NodeID = id
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.fastGossip = true
	// Short enough for quick elections, long enough that a loaded 2-core
	// machine under -race does not lose leaders to scheduling delays.
	cfg.raftTimeout = 400 * time.Millisecond
	cfg.StabilizationTime = 200 * time.Millisecond
	return cfg
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, nodes: map[string]*Node{}, trans: map[string]*raft.InmemTransport{}, cut: map[[2]string]bool{}}
	t.Cleanup(func() {
		c.mu.Lock()
		nodes := c.nodes
		c.mu.Unlock()
		for _, n := range nodes {
			n.Close()
		}
	})
	return c
}

// start opens a node and connects its transport with every other's.
func (c *testCluster) start(cfg Config) *Node {
	c.t.Helper()
	n, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("open %s: %v", cfg.NodeID, err)
	}
	c.add(n)
	return n
}

func (c *testCluster) add(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tr := n.cl.Transport().(*raft.InmemTransport)
	id := n.cfg.NodeID
	for oid, ot := range c.trans {
		if !c.cut[[2]string{id, oid}] {
			tr.Connect(raft.ServerAddress(oid), ot)
			ot.Connect(raft.ServerAddress(id), tr)
		}
	}
	c.nodes[id], c.trans[id] = n, tr
}

// stop closes a node (a crash, as far as the others can tell: Raft stops
// answering).
func (c *testCluster) stop(id string) {
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	tr := c.trans[id]
	delete(c.trans, id)
	for _, ot := range c.trans {
		ot.Disconnect(raft.ServerAddress(id))
	}
	c.mu.Unlock()
	tr.DisconnectAll()
	n.Close()
}

// isolate cuts Raft traffic between id and every other node; heal undoes it.
func (c *testCluster) isolate(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for oid, ot := range c.trans {
		if oid == id {
			continue
		}
		c.cut[[2]string{id, oid}], c.cut[[2]string{oid, id}] = true, true
		ot.Disconnect(raft.ServerAddress(id))
		c.trans[id].Disconnect(raft.ServerAddress(oid))
	}
}

func (c *testCluster) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = map[[2]string]bool{}
	for id, tr := range c.trans {
		for oid, ot := range c.trans {
			if id != oid {
				tr.Connect(raft.ServerAddress(oid), ot)
			}
		}
	}
}

func (c *testCluster) node(id string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// leader waits for exactly one ready leader among the running nodes
// (excluding the ones named) and returns it.
func (c *testCluster) leader(exclude ...string) *Node {
	c.t.Helper()
	var l *Node
	waitFor(c.t, 10*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		l = nil
	next:
		for id, n := range c.nodes {
			for _, x := range exclude {
				if x == id {
					continue next
				}
			}
			if n.cl.Raft.State() == raft.Leader && n.isLeaderReady() && n.ReadyErr() == nil {
				if l != nil {
					return false
				}
				l = n
			}
		}
		return l != nil
	})
	return l
}

// voters waits until the leader's configuration has want voters.
func (c *testCluster) voters(want int) {
	c.t.Helper()
	waitFor(c.t, 15*time.Second, func() bool {
		l := c.leader()
		fut := l.cl.Raft.GetConfiguration()
		if fut.Error() != nil {
			return false
		}
		k := 0
		for _, s := range fut.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				k++
			}
		}
		return k == want
	})
}

// threeNodes starts n1 alone, then n2 and n3 joining it through gossip.
func threeNodes(t *testing.T) *testCluster {
	c := newTestCluster(t)
	n1 := c.start(clusterConfig("n1"))
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.Join = []string{n1.mem.gossip.Addr()}
		c.start(cfg)
	}
	c.voters(3)
	return c
}

func TestClusterJoinAndReplicate(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	// Every replica applies it; the registry knows every server's data
	// directory.
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		waitFor(t, 5*time.Second, func() bool { return n.AppliedIndex() >= l.AppliedIndex() })
		got, err := n.GetLease(ctx, lease.LeaseID, true)
		if err != nil || got.FencingToken != lease.FencingToken {
			t.Fatalf("%s: stale read %v %+v", id, err, got)
		}
		waitFor(t, 5*time.Second, func() bool {
			rec, ok := l.memberRecord(id)
			return ok && rec.Incarnation == n.mem.incarnation && !rec.Removed
		})
	}
	// The leader reports every member healthy (autopilot, from gossip ping
	// acks), with a recent last contact and its HTTP address.
	waitFor(t, 10*time.Second, func() bool {
		st, err := l.ClusterStatus(ctx, true)
		if err != nil || len(st.Members) != 3 {
			return false
		}
		for _, m := range st.Members {
			if m.Health != "healthy" || m.LastContact == nil || time.Since(*m.LastContact) > 5*time.Second ||
				m.HTTPAddr == "" || m.Gossip != "alive" || !m.Voter {
				return false
			}
		}
		return true
	})
	// A follower answers NO_LEADER for a linearizable read, with the
	// leader named, and knows the leader's HTTP address for forwarding.
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		if n == l {
			continue
		}
		if _, err := n.GetLease(ctx, lease.LeaseID, false); ErrorCode(err) != CodeNoLeader {
			t.Fatalf("follower linearizable read: %v", err)
		}
		info, ok := n.Leader()
		if !ok || info.ID != l.cfg.NodeID || info.HTTPAddr != l.cfg.HTTPAddr || info.Self {
			t.Fatalf("follower's leader info %+v %v", info, ok)
		}
		st, err := n.ClusterStatus(ctx, true)
		if err != nil || len(st.Members) != 3 || st.Leader != l.cfg.NodeID {
			t.Fatalf("cluster status on follower: %v %+v", err, st)
		}
	}
}

func TestClusterFailoverKeepsRemainingTime(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	old := c.leader()
	lease, _, err := old.Acquire(ctx, AcquireRequest{Key: "tuner/1", Holder: "w1", TTLMS: 3000})
	if err != nil {
		t.Fatal(err)
	}
	before, err := old.GetLease(ctx, lease.LeaseID, false)
	if err != nil {
		t.Fatal(err)
	}
	oldID := old.cfg.NodeID
	c.stop(oldID)
	nl := c.leader(oldID)
	after, err := nl.GetLease(ctx, lease.LeaseID, false)
	if err != nil {
		t.Fatal(err)
	}
	// Not reset to the full TTL, and not gone: the clock resumed from the
	// last committed tick, so at most the failover's duration passed.
	if after.State != "active" || after.FencingToken != lease.FencingToken {
		t.Fatalf("after failover: %+v", after)
	}
	if after.RemainingMS > before.RemainingMS {
		t.Fatalf("remaining time grew across failover: %d -> %d", before.RemainingMS, after.RemainingMS)
	}
	// The new leader grants nothing on the key, and new fences are higher.
	if _, _, err := nl.Acquire(ctx, AcquireRequest{Key: "tuner/1", Holder: "w2", TTLMS: 3000}); ErrorCode(err) != CodeLeaseHeld {
		t.Fatalf("second holder on a held key after failover: %v", err)
	}
	l2, _, err := nl.Acquire(ctx, AcquireRequest{Key: "tuner/2", Holder: "w2", TTLMS: 3000})
	if err != nil || l2.FencingToken <= lease.FencingToken {
		t.Fatalf("acquire after failover: %v %+v", err, l2)
	}
	// It expires no earlier than its TTL after the grant.
	granted := time.Now().Add(-time.Duration(lease.TTLMS-before.RemainingMS) * time.Millisecond)
	waitFor(t, 10*time.Second, func() bool {
		got, err := nl.GetLease(ctx, lease.LeaseID, false)
		if err == nil && got.State == "expired" {
			if time.Since(granted) < 3*time.Second {
				t.Errorf("expired %v after grant, TTL 3s", time.Since(granted))
			}
			return true
		}
		return false
	})
}

func TestClusterDeposedLeaderNeitherGrantsNorReads(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	old := c.leader()
	lease, _, err := old.Acquire(ctx, AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	c.isolate(old.cfg.NodeID)
	// Until it notices, the old leader may still think it leads: it must
	// not answer a linearizable read nor grant.
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := old.GetLease(cctx, lease.LeaseID, false); err == nil {
		t.Fatal("isolated leader answered a linearizable read")
	}
	if _, _, err := old.Acquire(cctx, AcquireRequest{Key: "k2", Holder: "w1", TTLMS: 60000}); err == nil {
		t.Fatal("isolated leader granted a lease")
	}
	nl := c.leader(old.cfg.NodeID)
	if _, _, err := nl.Acquire(ctx, AcquireRequest{Key: "k2", Holder: "w2", TTLMS: 60000}); err != nil {
		t.Fatalf("majority side: %v", err)
	}
	c.heal()
	// The old leader rejoins as a follower and catches up.
	waitFor(t, 10*time.Second, func() bool {
		return old.cl.Raft.State() == raft.Follower && old.AppliedIndex() >= nl.AppliedIndex()
	})
}

func TestClusterRemoveMemberKeepsLeasesAndRefusesReturn(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	var victim string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != l.cfg.NodeID {
			victim = id
		}
	}
	if err := l.RemoveMember(ctx, victim); err != nil {
		t.Fatal(err)
	}
	got, err := l.GetLease(ctx, lease.LeaseID, false)
	if err != nil || got.State != "active" || got.RemainingMS < 50000 {
		t.Fatalf("lease after removing a member: %v %+v", err, got)
	}
	rec, ok := l.memberRecord(victim)
	if !ok || !rec.Removed {
		t.Fatalf("no tombstone for %s: %+v", victim, rec)
	}
	// The removed server is still running and gossiping: it is not re-added.
	for range 3 {
		l.reconcile(ctx)
	}
	c.voters(2)
	fut := l.cl.Raft.GetConfiguration()
	for _, s := range fut.Configuration().Servers {
		if string(s.ID) == victim {
			t.Fatalf("removed server %s re-added: %+v", victim, fut.Configuration())
		}
	}
}

func TestClusterWipedServerRefused(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	var victim string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != l.cfg.NodeID {
			victim = id
		}
	}
	waitFor(t, 5*time.Second, func() bool {
		_, ok := l.memberRecord(victim)
		return ok
	})
	c.stop(victim)
	// The same id with a new (in-memory, so empty) data directory.
	cfg := clusterConfig(victim)
	cfg.Join = []string{l.mem.gossip.Addr()}
	if n, err := Open(cfg); err == nil {
		n.Close()
		t.Fatal("a wiped server under an old id was let in")
	} else if !contains(err.Error(), "cluster remove") {
		t.Fatalf("unclear refusal: %v", err)
	}
	// Once an operator removes the old member, it joins as a new server.
	if err := l.RemoveMember(context.Background(), victim); err != nil {
		t.Fatal(err)
	}
	c.start(cfg)
	c.voters(3)
}

func TestClusterBootstrapExpect(t *testing.T) {
	c := newTestCluster(t)
	ids := []string{"a", "b", "c"}
	addrs := make([]string, len(ids))
	for i := range ids {
		addrs[i] = freeGossipAddr(t)
	}
	var wg sync.WaitGroup
	opened := make([]*Node, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		cfg := clusterConfig(id)
		cfg.GossipAddr = addrs[i]
		cfg.Join = addrs
		cfg.BootstrapExpect = 3
		// Real ports: bootstrap-expect needs the addresses up front.
		cfg.InMemory = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			opened[i], errs[i] = openKeepPort(cfg)
		}()
	}
	wg.Wait()
	for i, n := range opened {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		c.add(n)
	}
	c.voters(3)
	l := c.leader()
	if _, _, err := l.Acquire(context.Background(), AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000}); err != nil {
		t.Fatal(err)
	}
	// Exactly one cluster: every node has the same three-server configuration.
	for _, n := range opened {
		fut := n.cl.Raft.GetConfiguration()
		if fut.Error() != nil || len(fut.Configuration().Servers) != 3 {
			t.Fatalf("%s: configuration %+v", n.cfg.NodeID, fut.Configuration())
		}
	}
}

func freeGossipAddr(t *testing.T) string {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		pc.Close()
		return addr
	}
	t.Fatal("no free port")
	return ""
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// openKeepPort opens an in-memory node whose gossip binds the configured
// port (InMemory otherwise picks an ephemeral one).
func openKeepPort(cfg Config) (*Node, error) {
	cfg.keepGossipPort = true
	return Open(cfg)
}

func TestClusterSnapshotInstallToLaggingFollower(t *testing.T) {
	c := newTestCluster(t)
	small := func(id string) Config {
		cfg := clusterConfig(id)
		cfg.SnapshotThreshold = 64
		cfg.SnapshotInterval = 50 * time.Millisecond
		cfg.TrailingLogs = 16
		return cfg
	}
	n1 := c.start(small("n1"))
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := small(id)
		cfg.Join = []string{n1.mem.gossip.Addr()}
		c.start(cfg)
	}
	c.voters(3)
	ctx := context.Background()
	l := c.leader()
	var lag string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != l.cfg.NodeID {
			lag = id
		}
	}
	c.isolate(lag)
	// Enough writes that the leader snapshots and compacts its log past
	// what the lagging follower has.
	var leases []*Lease
	for i := range 300 {
		ls, _, err := l.Acquire(ctx, AcquireRequest{Key: "snap/" + strconv.Itoa(i), Holder: "h", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, ls)
	}
	// The leader's latest snapshot is beyond everything the lagging
	// follower has, so its log no longer reaches back: healing must
	// install a snapshot.
	lagNode := c.node(lag)
	lagLast := lagNode.cl.Raft.LastIndex()
	waitFor(t, 10*time.Second, func() bool {
		snap, _ := strconv.ParseUint(l.cl.Raft.Stats()["last_snapshot_index"], 10, 64)
		return snap > lagLast+16
	})
	c.heal()
	waitFor(t, 15*time.Second, func() bool { return lagNode.AppliedIndex() >= l.AppliedIndex() })
	// A snapshot beyond its own log can only have come from the leader
	// (Raft records it just after the state machine restored it).
	waitFor(t, 5*time.Second, func() bool {
		got, _ := strconv.ParseUint(lagNode.cl.Raft.Stats()["last_snapshot_index"], 10, 64)
		return got > lagLast
	})
	for _, ls := range leases {
		got, err := lagNode.GetLease(ctx, ls.LeaseID, true)
		if err != nil || got.FencingToken != ls.FencingToken || got.State != "active" {
			t.Fatalf("after snapshot install: %v %+v", err, got)
		}
	}
	// The follower's state equals the leader's, byte for byte.
	sameState(t, l, lagNode)
	// The follower reports the install; the leader installed nothing.
	if st, err := lagNode.LocalState(ctx, 0); err != nil || st.SnapshotsInstalled < 1 || st.SnapshotsRestored < st.SnapshotsInstalled {
		t.Fatalf("lagging follower's local state: %+v %v", st, err)
	}
	if st, err := l.LocalState(ctx, 0); err != nil || st.SnapshotsInstalled != 0 || st.SnapshotsRestored != 0 {
		t.Fatalf("leader's local state: %+v %v", st, err)
	}
}

// sameState waits for a moment when both nodes have applied the same index
// and checks that their states encode to the same bytes.
func sameState(t *testing.T, a, b *Node) {
	t.Helper()
	capture := func(n *Node) (uint64, []byte) {
		n.rep.mu.RLock()
		s := n.rep.f.Snapshot()
		n.rep.mu.RUnlock()
		var buf bytes.Buffer
		if _, err := s.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		return s.Index(), buf.Bytes()
	}
	var ia, ib uint64
	var ba, bb []byte
	waitFor(t, 10*time.Second, func() bool {
		ia, ba = capture(a)
		ib, bb = capture(b)
		return ia == ib
	})
	if !bytes.Equal(ba, bb) {
		t.Fatalf("states differ at index %d (%d vs %d bytes)", ia, len(ba), len(bb))
	}
}
