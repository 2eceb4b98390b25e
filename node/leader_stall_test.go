package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/internal/diskfault"
	"github.com/leasehold/leasehold/wire"
)

// faultyCluster is threeNodes with every node's Raft stores behind a
// diskfault switch (and an optional extra wrapper).
func faultyCluster(t *testing.T, adjust func(cfg *Config)) (*testCluster, map[string]*diskfault.Fault) {
	faults := map[string]*diskfault.Fault{}
	c := newTestCluster(t)
	// Registered after the cluster's cleanup, so it runs first: a node
	// whose disk is stalled cannot shut Raft down.
	t.Cleanup(func() {
		for _, f := range faults {
			f.Set(false, 0)
		}
	})
	cfgFor := func(id string) Config {
		cfg := clusterConfig(id)
		f := &diskfault.Fault{}
		faults[id] = f
		inner := cfg.WrapRaftStores
		cfg.WrapRaftStores = func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
			l, s = f.Wrap(l, s)
			if inner != nil {
				return inner(l, s)
			}
			return l, s
		}
		if adjust != nil {
			adjust(&cfg)
		}
		return cfg
	}
	n1 := c.start(cfgFor("n1"))
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := cfgFor(id)
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		c.start(cfg)
	}
	c.voters(3)
	return c, faults
}

func (n *Node) tickNow() uint64 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Tick()
}

// A leader whose disk stalls holds every commit (its own log write is part
// of each), while its heartbeats keep the followers from electing anyone
// else: the cluster clock stops until the disk recovers. The leader must
// notice that it commits nothing and hand leadership on, so that the
// healthy majority elects a leader and the clock resumes.
func TestLeaderWithStalledDiskStepsDown(t *testing.T) {
	c, faults := faultyCluster(t, nil)
	l := c.leader()
	lid := l.cfg.NodeID
	tick := l.tickNow()
	stalledAt := time.Now()
	faults[lid].Set(true, 0)
	t.Logf("stalled the disk of leader %s at tick %d", lid, tick)

	// A new ready leader among the others, and the clock moving there.
	// The bound is generous: the watchdog waits leaderStall (3 s), the
	// transfer or forced election and one tick period follow.
	var nl *Node
	waitFor(t, 20*time.Second, func() bool {
		for _, id := range []string{"n1", "n2", "n3"} {
			n := c.node(id)
			if id == lid || !n.cl.IsLeader() || !n.lt.isReady() {
				continue
			}
			if n.tickNow() > tick+2 {
				nl = n
				return true
			}
		}
		return false
	})
	t.Logf("new leader %s ticking %v after the stall began", nl.cfg.NodeID, time.Since(stalledAt).Round(time.Millisecond))
	if faults[lid].Waiting() == 0 {
		t.Fatal("the stalled leader's disk held no write: the fault was not exercised")
	}
	// The new leader serves writes while the old one's disk is stalled.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000}); err != nil {
		t.Fatalf("acquire on the new leader: %v", err)
	}

	// Healed, the old leader follows and catches up.
	faults[lid].Set(false, 0)
	old := c.node(lid)
	waitFor(t, 20*time.Second, func() bool {
		return old.cl.State() == cluster.Follower && old.AppliedIndex() >= nl.AppliedIndex() && old.tickNow() > tick+2
	})
}

// leaderHook stalls, once armed, the first log write of commands this node
// makes as leader: a commit stall right after an election, longer than a
// proposal may wait.
type leaderHook struct {
	raft.LogStore
	armed   atomic.Bool
	leading func() bool
	stall   time.Duration
	hit     chan struct{}
	once    sync.Once
}

func (h *leaderHook) StoreLogs(ls []*raft.Log) error {
	if h.armed.Load() && h.leading() {
		for _, l := range ls {
			if l.Type == raft.LogCommand {
				h.armed.Store(false)
				h.once.Do(func() { close(h.hit) })
				time.Sleep(h.stall) // the stalled log write under test
				break
			}
		}
	}
	return h.LogStore.StoreLogs(ls)
}

// A commit stall right after an election that outlasts the registry
// proposal (2 x ApplyTimeout) made the leader give up its term's setup
// and lead without a clock until a restart. The leader retries instead,
// and its clock starts once the stall is over.
func TestLeaderRetriesSetupAfterCommitStall(t *testing.T) {
	hooks := map[string]*leaderHook{}
	var nodes sync.Map
	c, _ := faultyCluster(t, func(cfg *Config) {
		cfg.ApplyTimeout = 150 * time.Millisecond
		id := cfg.NodeID
		h := &leaderHook{stall: 1500 * time.Millisecond, hit: make(chan struct{})}
		h.leading = func() bool {
			n, ok := nodes.Load(id)
			return ok && n.(*Node).cl.IsLeader()
		}
		hooks[id] = h
		inner := cfg.WrapRaftStores
		cfg.WrapRaftStores = func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
			l, s = inner(l, s)
			h.LogStore = l
			return h, s
		}
	})
	for _, id := range []string{"n1", "n2", "n3"} {
		nodes.Store(id, c.node(id))
	}
	l := c.leader()
	var target *Node
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != l.cfg.NodeID {
			target = c.node(id)
			break
		}
	}
	tid := target.cfg.NodeID
	hooks[tid].armed.Store(true)
	var err error
	for try := 0; try < 20; try++ {
		if err = l.cl.TransferLeadershipTo(tid, tid); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // between tries of a bounded retry
	}
	if err != nil {
		t.Fatalf("transfer to %s: %v", tid, err)
	}
	select {
	case <-hooks[tid].hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the new leader's first command write was not stalled")
	}
	tick := target.tickNow()
	waitFor(t, 15*time.Second, func() bool {
		return target.cl.IsLeader() && target.lt.isReady() && target.tickNow() > tick+5
	})
	if st := target.cl.State(); st != cluster.Leader {
		t.Fatalf("%s is %v", tid, st)
	}
}

// A proposal whose ctx ends while it queues never reaches Raft: the tick
// of a leadership term that has ended cannot be committed in a later one.
func TestAbandonedProposalIsDropped(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	// Hold the batcher: it takes a slot of inflight before each entry.
	for i := 0; i < cap(n.gc.inflight); i++ {
		n.gc.inflight <- struct{}{}
	}
	stale := &fsm.Member{ID: "stale", Incarnation: "x"}
	res := make(chan error, 1)
	// Ticks queue behind the held batcher too, so the queue growing does
	// not prove that the proposal is in it; the answer to the cancel does:
	// a proposal cancelled before it queued gets ctx's error, one queued
	// is abandoned (INDETERMINATE). Try again until it was queued.
	var ctx context.Context
	queued := false
	for try := 0; try < 20 && !queued; try++ {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.Background())
		before := len(n.gc.propCh)
		go func() {
			_, _, err := n.propose(ctx, stale)
			res <- err
		}()
		waitFor(t, 5*time.Second, func() bool { return len(n.gc.propCh) > before })
		cancel()
		queued = !errors.Is(<-res, context.Canceled)
	}
	if !queued {
		t.Fatal("the proposal was never queued before its cancel")
	}
	before := n.AppliedIndex()
	for i := 0; i < cap(n.gc.inflight); i++ {
		<-n.gc.inflight
	}
	// Something after it, through the same queue, so we know the batcher
	// has passed it.
	if _, _, err := n.propose(context.Background(), &fsm.Member{ID: "live", Incarnation: "y"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.rc.memberRecord("stale"); ok {
		t.Fatalf("a proposal abandoned while queued was applied (applied index %d -> %d)", before, n.AppliedIndex())
	}
	if _, ok := n.rc.memberRecord("live"); !ok {
		t.Fatal("the live proposal was not applied")
	}
	// A cancelled ctx is refused before queueing at all.
	for i := 0; i < 20; i++ {
		if _, _, err := n.propose(ctx, stale); err == nil {
			t.Fatal("a proposal with an ended ctx was applied")
		}
	}
	if _, ok := n.rc.memberRecord("stale"); ok {
		t.Fatal("a proposal with an ended ctx was applied")
	}
}
