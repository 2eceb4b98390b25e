package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// Node is one running Leasehold server. Create it with Open.
type Node struct {
	cfg   Config
	log   *slog.Logger
	rep   *replica
	hub   *hub
	stats *counters
	cl    *cluster.Cluster

	propCh   chan *proposal
	inflight chan struct{}

	waitMu  sync.Mutex
	waiters map[string][]chan fsm.Notice

	leaderCtx atomic.Pointer[context.Context] // set once this term's barrier applied

	mem      *membership
	hadState atomic.Bool                         // Raft state exists (gossiped)
	raftP    atomic.Pointer[raft.Raft]           // set once Raft runs (gossip callbacks)
	pilot    atomic.Pointer[autopilot.Autopilot] // of the current leadership term
	apState  atomic.Pointer[autopilot.State]

	stopClock func() // undoes startClock

	ready     chan struct{}
	closing   chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts a node: it opens (or creates) the Raft state in cfg.DataDir,
// bootstraps a single-node cluster when there is no state and
// BootstrapExpect <= 1, and starts serving. Ready is closed once a leader is
// known and this node has applied up to it.
func Open(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.raftTimeout == 0 {
		cfg.raftTimeout = cfg.RaftTimeout
	}
	cfg.fastGossip = cfg.fastGossip || cfg.FastGossip
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg: cfg, log: logger, hub: newHub(cfg.EventHistory), stats: newCounters(),
		propCh: make(chan *proposal, 4096), inflight: make(chan struct{}, 2),
		waiters: make(map[string][]chan fsm.Notice), ready: make(chan struct{}), closing: make(chan struct{}),
	}
	n.rep = newReplica(n.hub, n.stats, n.deliverNotices)
	n.rep.defaultPeriod = cfg.TickPeriod.Milliseconds()
	n.rep.leading = func() bool {
		r := n.raftP.Load()
		return r != nil && r.State() == raft.Leader
	}
	inc, err := loadIncarnation(cfg)
	if err != nil {
		return nil, err
	}
	n.mem = &membership{incarnation: inc, failedAt: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	host, err := advertiseHost(cfg)
	if err != nil {
		return nil, err
	}
	raftAdv := cfg.RaftAdvertise
	if raftAdv == "" && host != "" {
		raftAdv = withHost(cfg.RaftAddr, host)
	}
	n.stopClock = startClock(logger)
	cl, err := cluster.Open(cluster.Config{
		NodeID: cfg.NodeID, Dir: cfg.DataDir, BindAddr: cfg.RaftAddr, Advertise: raftAdv,
		InMemory: cfg.InMemory, Bootstrap: cfg.BootstrapExpect <= 1 && len(cfg.Join) == 0,
		SnapshotThreshold: cfg.SnapshotThreshold, SnapshotInterval: cfg.SnapshotInterval, TrailingLogs: cfg.TrailingLogs,
		HeartbeatTimeout: cfg.raftTimeout, ElectionTimeout: cfg.raftTimeout, LeaderLeaseTimeout: cfg.raftTimeout / 2,
		Logger: logger, BeforeStart: n.startGossip, TLS: cfg.RaftTLS, WrapStream: cfg.WrapRaftStream,
	}, n.rep)
	if err != nil {
		if n.mem.gossip != nil {
			n.mem.gossip.Close()
		}
		n.stopClock()
		return nil, err
	}
	n.cl = cl
	n.raftP.Store(cl.Raft)
	n.rep.started.Store(true) // restores from here on are installs or operator restores
	cl.OnLeadership(n.lead)
	n.wg.Add(3)
	go n.batcher()
	go n.watchReady()
	go n.watchMembership()
	return n, nil
}

// Ready is closed once a leader is known and this node has applied up to it.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// ReadyErr is nil when a leader is known and this node has applied every
// entry committed when it last heard from it; otherwise it says why not.
func (n *Node) ReadyErr() error {
	select {
	case <-n.closing:
		return &Error{Code: fsm.CodeUnavailable, Message: "node is shutting down"}
	default:
	}
	if err := n.refusedErr(); err != nil {
		return &Error{Code: fsm.CodeUnavailable, Message: err.Error()}
	}
	if addr, _ := n.cl.Raft.LeaderWithID(); addr == "" {
		return &Error{Code: CodeNoLeader, Message: "no leader is known"}
	}
	if n.cl.Raft.State() == raft.Leader && !n.isLeaderReady() {
		return &Error{Code: CodeNoLeader, Message: "leader has not yet applied its predecessors' entries"}
	}
	if applied, commit := n.rep.applied.Load(), n.cl.Raft.CommitIndex(); applied < commit {
		return &Error{Code: fsm.CodeUnavailable, Message: "applying the log: not caught up with the leader yet"}
	}
	n.rep.mu.RLock()
	tick := n.rep.f.Tick()
	n.rep.mu.RUnlock()
	if tick == 0 {
		return &Error{Code: fsm.CodeUnavailable, Message: "the cluster clock has not started yet (no tick committed)"}
	}
	return nil
}

// AppliedIndex is the Raft index of the last entry applied on this node.
func (n *Node) AppliedIndex() uint64 { return n.rep.applied.Load() }

// Raft exposes the underlying Raft instance (for tests and tooling).
func (n *Node) Raft() *raft.Raft { return n.cl.Raft }

func (n *Node) watchReady() {
	defer n.wg.Done()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case <-t.C:
			if n.ReadyErr() == nil {
				close(n.ready)
				return
			}
		}
	}
}

func (n *Node) isLeaderReady() bool {
	p := n.leaderCtx.Load()
	return p != nil && (*p).Err() == nil
}

// lead runs for one leadership term: apply a barrier so that state reflects
// everything earlier leaders committed, then tick until leadership ends.
func (n *Node) lead(ctx context.Context) {
	if err := n.cl.Raft.Barrier(n.cfg.ApplyTimeout).Error(); err != nil {
		if ctx.Err() == nil {
			n.log.Warn("leadership barrier failed", "err", err)
		}
		return
	}
	// One entry the state machine sees (this server's registry record):
	// Raft's own no-op and the barrier never reach it, so without this the
	// applied index would trail the commit index, and linearizable reads
	// would wait, until the first tick.
	if _, _, err := n.propose(ctx, &fsm.Member{ID: n.cfg.NodeID, Incarnation: n.mem.incarnation}); err != nil {
		if ctx.Err() == nil {
			n.log.Warn("leadership: recording this server failed", "err", err)
		}
		return
	}
	n.leaderCtx.Store(&ctx)
	go n.reconcileLoop(ctx)
	n.tickLoop(ctx)
}

// tickLoop is the cluster clock. It waits one period after gaining
// leadership before the first tick (a new leader must not compress time;
// only a new cluster, at tick 0, starts its clock at once),
// proposes tick k+1 only after tick k has applied here, and never sooner
// than one period after it proposed tick k: committed ticks are therefore
// never closer than one period in real time, except that one tick may follow
// its predecessor quickly after a stall (fsm.GraceTicks covers it).
func (n *Node) tickLoop(ctx context.Context) {
	period := n.period()
	if period != n.cfg.TickPeriod {
		n.log.Warn("the cluster's tick period was fixed by its first tick; ignoring the configured one",
			"tick_period", period, "configured", n.cfg.TickPeriod)
	}
	retain := uint64((n.cfg.Retention + period - 1) / period)
	first := period
	n.rep.mu.RLock()
	if n.rep.f.Tick() == 0 || canaryTickAtOnce {
		// A new cluster: no earlier tick exists that a quick first one
		// could crowd, so the clock starts at once.
		first = 0
	}
	n.rep.mu.RUnlock()
	timer := newClockTimer(first)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sent := monoNow()
		n.rep.mu.RLock()
		next := n.rep.f.Tick() + 1
		n.rep.mu.RUnlock()
		_, _, err := n.propose(ctx, &fsm.Tick{Tick: next, WallMS: wallNow().UnixMilli(),
			PeriodMS: period.Milliseconds(), RetainTicks: retain})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			n.log.Warn("tick not committed", "tick", next, "err", err)
		}
		timer.Reset(max(sent.Add(period).Sub(monoNow()), 0))
	}
}

// period is the cluster's tick period.
func (n *Node) period() time.Duration {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return time.Duration(n.rep.period()) * time.Millisecond
}

// Close stops the node: Raft shuts down, subscriptions end, pending
// operations fail. Acknowledged writes are on disk already.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.closing)
		n.closeErr = n.cl.Close()
		n.mem.gossip.Close()
		n.hub.close()
		n.wg.Wait()
		n.stopClock()
	})
	return n.closeErr
}

func (n *Node) deliverNotices(ns []fsm.Notice) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	for _, no := range ns {
		for _, ch := range n.waiters[no.LeaseID] {
			select {
			case ch <- no:
			default:
			}
		}
		delete(n.waiters, no.LeaseID)
	}
}

func (n *Node) addWaiter(id string) chan fsm.Notice {
	ch := make(chan fsm.Notice, 1)
	n.waitMu.Lock()
	n.waiters[id] = append(n.waiters[id], ch)
	n.waitMu.Unlock()
	return ch
}

// dropWaiter removes one listener for id and returns how many remain.
func (n *Node) dropWaiter(id string, ch chan fsm.Notice) int {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	list := n.waiters[id]
	for i, c := range list {
		if c == ch {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(n.waiters, id)
	} else {
		n.waiters[id] = list
	}
	return len(list)
}

var errClosed = errors.New("node closed")
