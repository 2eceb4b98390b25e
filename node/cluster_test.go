package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/internal/harness"
	"github.com/leasehold/leasehold/wire"
)

// testCluster runs several in-process nodes (internal/harness): Raft over
// connected in-memory transports (which isolate and heal cut and mend),
// gossip over loopback. Its methods fail the test.
type testCluster struct {
	t *testing.T
	h *harness.Cluster[Config, *Node]
}

func clusterConfig(id string) Config {
	cfg := testConfig(nil, "")
	cfg.NodeID = id
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.FastGossip = true
	// Short enough for quick elections, long enough that a loaded 2-core
	// machine under -race does not lose leaders to scheduling delays (the
	// leader steps down after half of it without a quorum's answer; 400 ms
	// left it 200 ms, less than a saturated machine may stall a goroutine).
	cfg.RaftTimeout = time.Second
	cfg.StabilizationTime = 200 * time.Millisecond
	return cfg
}

func newTestCluster(t *testing.T) *testCluster {
	h := harness.New(harness.Options[Config, *Node]{Open: func(cfg Config, logs io.Writer) (*Node, error) {
		if cfg.Logger == nil {
			// Kept for the failure report: an election that never ends is
			// explained by Raft's own lines, not by the test's view of it.
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)).With("server", cfg.NodeID)
		}
		return Open(cfg)
	}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines of the cluster's servers:\n%s", h.Tail())
		}
		h.Close()
	})
	return &testCluster{t: t, h: h}
}

// start opens a node and connects its transport with every other's.
func (c *testCluster) start(cfg Config) *Node {
	c.t.Helper()
	n, err := c.h.Start(cfg)
	if err != nil {
		c.t.Fatalf("open %s: %v", cfg.NodeID, err)
	}
	return n
}

// stop closes a node (a crash, as far as the others can tell: Raft stops
// answering).
func (c *testCluster) stop(id string) {
	if err := c.h.Stop(id); errors.Is(err, harness.ErrNotRunning) {
		c.t.Fatal(err)
	}
}

// isolate cuts Raft traffic between id and every other node; heal undoes it.
func (c *testCluster) isolate(id string) {
	if err := c.h.Isolate(id); err != nil {
		c.t.Fatal(err)
	}
}

func (c *testCluster) heal() { c.h.Heal() }

// node returns the running node id, nil if it does not run.
func (c *testCluster) node(id string) *Node {
	n, _ := c.h.Server(id)
	return n
}

// leader waits for exactly one ready leader among the running nodes
// (excluding the ones named) and returns it.
func (c *testCluster) leader(exclude ...string) *Node {
	c.t.Helper()
	// An election takes a second or two; a saturated machine (the race
	// detector, every package's tests at once) can stretch it far longer.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	l, err := c.h.WaitLeader(ctx, exclude...)
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// voters waits until the leader's configuration has want voters.
func (c *testCluster) voters(want int) {
	c.t.Helper()
	// Gossip, autopilot's stabilization and two membership changes: seconds
	// on an idle machine, more with both cores saturated.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.h.WaitVoters(ctx, want); err != nil {
		c.t.Fatal(err)
	}
}

// threeNodes starts n1 alone, then n2 and n3 joining it through gossip.
func threeNodes(t *testing.T) *testCluster {
	c := newTestCluster(t)
	n1 := c.start(clusterConfig("n1"))
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		c.start(cfg)
	}
	c.voters(3)
	return c
}

func TestClusterJoinAndReplicate(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	// Every replica applies it; the registry knows every server's data
	// directory.
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		// The leader's index as of now: it keeps moving with every tick,
		// and a loaded follower may trail it by a tick at every instant.
		target := l.AppliedIndex()
		waitFor(t, 10*time.Second, func() bool { return n.AppliedIndex() >= target })
		got, err := n.GetLease(ctx, lease.LeaseID, true)
		if err != nil || got.FencingToken != lease.FencingToken {
			t.Fatalf("%s: stale read %v %+v", id, err, got)
		}
		waitFor(t, 5*time.Second, func() bool {
			rec, ok := l.rc.memberRecord(id)
			return ok && rec.Incarnation == n.mem.Incarnation() && !rec.Removed
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
		if _, err := n.GetLease(ctx, lease.LeaseID, false); wire.ErrorCode(err) != wire.CodeNoLeader {
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
	t.Parallel() // long and mostly waiting: runs beside the other parallel tests
	c := threeNodes(t)
	ctx := context.Background()
	old := c.leader()
	// 5 s: the checks below run while it lives, after a failover on a
	// possibly loaded machine.
	sent := time.Now()
	lease, _, err := old.Acquire(ctx, wire.AcquireRequest{Key: "tuner/1", Holder: "w1", TTLMS: 5000})
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
	if _, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "tuner/1", Holder: "w2", TTLMS: 3000}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("second holder on a held key after failover: %v", err)
	}
	l2, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "tuner/2", Holder: "w2", TTLMS: 3000})
	if err != nil || l2.FencingToken <= lease.FencingToken {
		t.Fatalf("acquire after failover: %v %+v", err, l2)
	}
	// It expires no earlier than its TTL after the acquire was sent (the
	// grant came later: this bound holds however slow the machine).
	waitFor(t, 20*time.Second, func() bool {
		got, err := nl.GetLease(ctx, lease.LeaseID, false)
		if err == nil && got.State == "expired" {
			if time.Since(sent) < 5*time.Second {
				t.Errorf("expired %v after the acquire was sent, TTL 5s", time.Since(sent))
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
	lease, _, err := old.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	c.isolate(old.cfg.NodeID)
	// Until it notices, the old leader may still think it leads: it must
	// not grant (that needs a quorum it no longer reaches). A read it
	// answers at once may rest on a heartbeat that a follower answered just
	// as the link was cut (Raft counts an answer in flight, and a loaded
	// follower may take a while to give it): harmless, since no other
	// leader can exist yet, so that read is only checked for its value.
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if got, err := old.GetLease(cctx, lease.LeaseID, false); err == nil && (got.State != "active" || got.FencingToken != lease.FencingToken) {
		t.Fatalf("isolated leader read %+v", got)
	}
	if _, _, err := old.Acquire(cctx, wire.AcquireRequest{Key: "k2", Holder: "w1", TTLMS: 60000}); err == nil {
		t.Fatal("isolated leader granted a lease")
	}
	nl := c.leader(old.cfg.NodeID)
	k2, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "k2", Holder: "w2", TTLMS: 60000})
	if err != nil {
		t.Fatalf("majority side: %v", err)
	}
	// Now that another leader committed a write the old one cannot have,
	// a linearizable read on the old one must be refused, never answered
	// without it.
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	defer rcancel()
	if got, err := old.GetLease(rctx, k2.LeaseID, false); err == nil || wire.ErrorCode(err) == wire.CodeLeaseNotFound {
		t.Fatalf("deposed leader answered a linearizable read without the new leader's write: %+v %v", got, err)
	}
	if _, err := old.ListLeases(rctx, wire.ListRequest{Key: "k2"}, false); err == nil {
		t.Fatal("deposed leader answered a linearizable listing")
	}
	c.heal()
	// The old leader rejoins as a follower and catches up with what the
	// new leader had applied at the heal (a moving target otherwise: ticks
	// keep coming, and a loaded follower may trail by one at every poll).
	target := nl.AppliedIndex()
	waitFor(t, 20*time.Second, func() bool {
		return old.cl.State() == cluster.Follower && old.AppliedIndex() >= target
	})
}

func TestClusterRemoveMemberKeepsLeasesAndRefusesReturn(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000})
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
	rec, ok := l.rc.memberRecord(victim)
	if !ok || !rec.Removed {
		t.Fatalf("no tombstone for %s: %+v", victim, rec)
	}
	// The removed server is still running and gossiping: it is not re-added.
	for range 3 {
		l.rc.reconcile(ctx, l.rc.membership())
	}
	c.voters(2)
	conf, _ := l.cl.Configuration()
	for _, s := range conf.Servers {
		if string(s.ID) == victim {
			t.Fatalf("removed server %s re-added: %+v", victim, conf)
		}
	}
}

// A wiped server restarted under its id (with --join) is not refused: the
// leader replaces the old member, and it joins as a new server.
func TestClusterWipedServerReplaced(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside the other parallel tests
	c := threeNodes(t)
	l := c.leader()
	var victim string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != l.cfg.NodeID {
			victim = id
		}
	}
	waitFor(t, 5*time.Second, func() bool {
		_, ok := l.rc.memberRecord(victim)
		return ok
	})
	c.stop(victim)
	old, _ := l.rc.memberRecord(victim)
	// The same id with a new (in-memory, so empty) data directory: it
	// starts; the leader, seeing the new data directory in gossip, removes
	// the old member (an empty log must not vote) and adds the new one.
	cfg := clusterConfig(victim)
	cfg.Join = []string{l.mem.Gossip().Addr()}
	n := c.start(cfg)
	waitFor(t, 45*time.Second, func() bool { // gossip, then a removal and an addition
		rec, ok := l.rc.memberRecord(victim)
		return ok && !rec.Removed && rec.Incarnation == n.mem.Incarnation() && rec.Incarnation != old.Incarnation
	})
	c.voters(3)
}

func TestClusterBootstrapExpect(t *testing.T) {
	c := newTestCluster(t)
	ids := []string{"a", "b", "c"}
	addrs, err := harness.FreeAddrs(len(ids))
	if err != nil {
		t.Fatal(err)
	}
	cfgs := make([]Config, len(ids))
	for i, id := range ids {
		cfg := clusterConfig(id)
		cfg.GossipAddr = addrs[i]
		cfg.Join = addrs
		cfg.BootstrapExpect = 3
		// Real ports: bootstrap-expect needs the addresses up front.
		cfg.InMemory = true
		cfg.keepGossipPort = true
		cfgs[i] = cfg
	}
	opened, err := c.h.StartAll(cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	c.voters(3)
	l := c.leader()
	if _, _, err := l.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000}); err != nil {
		t.Fatal(err)
	}
	// Exactly one cluster: every node has the same three-server
	// configuration (a follower may apply the leader's latest one a moment
	// after the leader: polled).
	want, err := l.cl.Configuration()
	if err != nil || len(want.Servers) != 3 {
		t.Fatalf("leader's configuration %+v %v", want, err)
	}
	same := func(n *Node) bool {
		conf, err := n.cl.Configuration()
		if err != nil || len(conf.Servers) != 3 {
			return false
		}
		for _, s := range conf.Servers {
			if !slices.Contains(want.Servers, s) {
				return false
			}
		}
		return true
	}
	for _, n := range opened {
		deadline := time.Now().Add(10 * time.Second)
		for !same(n) {
			if time.Now().After(deadline) {
				conf, _ := n.cl.Configuration()
				t.Fatalf("%s: configuration %+v, the leader's %+v", n.cfg.NodeID, conf, want)
			}
			<-time.After(5 * time.Millisecond)
		}
	}
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

func TestClusterSnapshotInstallToLaggingFollower(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside the other parallel tests
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
		cfg.Join = []string{n1.mem.Gossip().Addr()}
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
	var leases []*wire.Lease
	for i := range 300 {
		ls, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "snap/" + strconv.Itoa(i), Holder: "h", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, ls)
	}
	// The leader's latest snapshot is beyond everything the lagging
	// follower has, so its log no longer reaches back: healing must
	// install a snapshot.
	lagNode := c.node(lag)
	lagLast := lagNode.cl.LastIndex()
	waitFor(t, 10*time.Second, func() bool {
		snap, _ := strconv.ParseUint(l.cl.Stats()["last_snapshot_index"], 10, 64)
		return snap > lagLast+16
	})
	c.heal()
	target := l.AppliedIndex()
	waitFor(t, 20*time.Second, func() bool { return lagNode.AppliedIndex() >= target })
	// A snapshot beyond its own log can only have come from the leader
	// (Raft records it just after the state machine restored it).
	waitFor(t, 5*time.Second, func() bool {
		got, _ := strconv.ParseUint(lagNode.cl.Stats()["last_snapshot_index"], 10, 64)
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

// sameState checks that a and b had the same state right after applying
// the same entry: the hash of its encoding (as a snapshot writes it),
// captured in each node's apply path at one index a little ahead. Capturing
// both "now" would need a moment when both have applied exactly the same
// entries, which ticks every 20 ms and a follower trailing by a tick on a
// loaded machine may never offer.
func sameState(t *testing.T, a, b *Node) {
	t.Helper()
	for lead := uint64(5); ; lead *= 2 {
		if lead > 5<<6 {
			t.Fatal("no common index ahead of both nodes could be hashed")
		}
		at := max(a.AppliedIndex(), b.AppliedIndex()) + lead
		sts, errs := make([]*LocalState, 2), make([]error, 2)
		var wg sync.WaitGroup
		for i, n := range []*Node{a, b} {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				sts[i], errs[i] = n.LocalState(ctx, at)
			})
		}
		wg.Wait()
		if wire.ErrorCode(errs[0]) == wire.CodeIndexPassed || wire.ErrorCode(errs[1]) == wire.CodeIndexPassed {
			continue // one node got there before its request: further ahead
		}
		for i, n := range []*Node{a, b} {
			if errs[i] != nil || sts[i].HashIndex != at || sts[i].StateHash == "" {
				t.Fatalf("%s: state at %d: %+v %v", n.cfg.NodeID, at, sts[i], errs[i])
			}
		}
		if sts[0].StateHash != sts[1].StateHash {
			t.Fatalf("states differ at index %d: %s on %s, %s on %s", at, sts[0].StateHash, a.cfg.NodeID, sts[1].StateHash, b.cfg.NodeID)
		}
		return
	}
}
