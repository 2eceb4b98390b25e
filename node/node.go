package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sort"
	"strconv"
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
	cfg     Config
	log     *slog.Logger
	rep     *replica
	hub     *hub
	stats   *counters
	metrics *nodeMetrics
	cl      *cluster.Cluster
	peer    peerServer

	propCh   chan *proposal
	inflight chan struct{}

	waitMu  sync.Mutex
	waiters map[string][]chan fsm.Notice

	leaderCtx atomic.Pointer[context.Context] // set once this term's barrier applied
	// chunkedOK: every server of the configuration reads limited ticks
	// and Expire entries (updateChunkedExpiry), so ticks may be limited.
	chunkedOK atomic.Bool

	mem         *membership
	idn         *identity
	seal        sealer
	sealRefused atomic.Pointer[error]               // set while the sealing key does not match the recorded check
	gated       atomic.Int64                        // unix ns of the last Raft connection admitRaft refused
	refreshing  atomic.Bool                         // refreshGossip runs
	conflictAt  atomic.Int64                        // unix ns of the last Raft connection refused for another cluster
	hadState    atomic.Bool                         // Raft state exists (gossiped)
	raftP       atomic.Pointer[raft.Raft]           // set once Raft runs (gossip callbacks)
	pilot       atomic.Pointer[autopilot.Autopilot] // of the current leadership term
	apState     atomic.Pointer[autopilot.State]

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
	n.metrics = newNodeMetrics(n, cfg.Registry)
	n.rep.metrics = n.metrics
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
	if n.idn, err = loadClusterID(cfg); err != nil {
		return nil, err
	}
	if n.seal, err = newSealer(cfg); err != nil {
		return nil, err
	}
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
		WrapStores: chaosStores(cfg.WrapRaftStores), LogEnd: func(last uint64) { n.rep.replayEnd.Store(last) },
		Identity: &cluster.Identity{ClusterID: n.clusterID, Admit: n.admitRaft,
			OnConflict: func(string, string) { n.conflictAt.Store(time.Now().UnixNano()) }, Legacy: n.legacyPeer},
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
	n.wg.Add(4)
	go n.watchLeader(cl.Raft)
	go n.batcher()
	go n.watchReady()
	go n.watchMembership()
	// A restart restored the latest snapshot already: a server whose
	// sealing key is not the one it records does not start. (One that
	// learns the check from the log later refuses to serve then.)
	if err := n.checkSeal(); err != nil {
		n.Close()
		return nil, err
	}
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
// everything earlier leaders committed, record this server, then tick until
// leadership ends. A leader must either run the clock or give leadership
// up: a failed barrier or registry write is retried, and a watchdog hands
// leadership on when this term has committed nothing of its own (setup or
// ticks) for leaderStall (a stalled disk holds Raft's leader loop, and with
// it every commit, while heartbeats still keep the followers loyal).
func (n *Node) lead(ctx context.Context) {
	progress := newProgress()
	go n.watchdog(ctx, progress)
	if !n.untilDone(ctx, "leadership barrier", func() error { return n.barrier(ctx) }) {
		return
	}
	progress.mark()
	// One entry the state machine sees (this server's registry record):
	// Raft's own no-op and the barrier never reach it, so without this the
	// applied index would trail the commit index, and linearizable reads
	// would wait, until the first tick.
	if !n.untilDone(ctx, "leadership: recording this server", func() error {
		_, _, err := n.propose(ctx, &fsm.Member{ID: n.cfg.NodeID, Incarnation: n.mem.incarnation})
		return err
	}) {
		return
	}
	progress.mark()
	n.leaderCtx.Store(&ctx)
	go n.reconcileLoop(ctx)
	n.tickLoop(ctx, progress)
}

// untilDone runs step until it succeeds, with backoff, while the term
// lasts; it reports whether it succeeded. Failures are logged at most once
// in about ten seconds.
func (n *Node) untilDone(ctx context.Context, what string, step func() error) bool {
	for try := 0; ; try++ {
		err := step()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if try%10 == 0 {
			n.log.Warn(what+" failed; retrying", "err", err, "attempt", try+1)
		}
		if sleepCtx(ctx, backoff(try)) != nil {
			return false
		}
	}
}

// barrier applies a Raft barrier, waiting no longer than ctx lives (a
// stalled disk holds it indefinitely).
func (n *Node) barrier(ctx context.Context) error {
	fut := n.cl.Raft.Barrier(n.cfg.ApplyTimeout)
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff is the pause before retry number try+1 of a leadership step.
func backoff(try int) time.Duration {
	return min(50*time.Millisecond<<min(try, 5), time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// termProgress is when a leadership term last committed an entry of its own
// (or began), on the real monotonic clock.
type termProgress struct {
	base time.Time
	last atomic.Int64 // since base
}

func newProgress() *termProgress { return &termProgress{base: time.Now()} }

func (p *termProgress) mark() { p.last.Store(int64(time.Since(p.base))) }

func (p *termProgress) since() time.Duration {
	return time.Since(p.base) - time.Duration(p.last.Load())
}

// leaderStall is how long a leader may go without committing an entry of
// its own term before it gives leadership up: a few seconds, well above a
// healthy commit's milliseconds and Raft's failover time.
func (n *Node) leaderStall() time.Duration {
	return max(3*time.Second, 3*n.cfg.TickPeriod, 4*n.cfg.raftTimeout)
}

// transferWait bounds how long a leadership transfer may take before the
// watchdog forces an election instead.
func (n *Node) transferWait() time.Duration {
	return max(time.Second, 2*n.cfg.raftTimeout)
}

// watchdog gives up leadership whenever this term has committed nothing
// for leaderStall while it still leads, and again after every further
// leaderStall without progress.
func (n *Node) watchdog(ctx context.Context, progress *termProgress) {
	bound := n.leaderStall()
	t := time.NewTicker(min(bound/8, 250*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.closing:
			return
		case <-t.C:
		}
		since := progress.since()
		// A refused server (removed, or of another cluster) commits
		// nothing by design: handing its leadership on changes nothing.
		if since < bound || n.cl.Raft.State() != raft.Leader || n.refusedErr() != nil {
			continue
		}
		n.log.Warn("this leader has committed nothing for too long; giving up leadership",
			"for", since.Round(time.Millisecond), "bound", bound)
		n.stepDown(ctx)
		progress.mark()
	}
}

// stepDown hands leadership on: a Raft leadership transfer, and if that
// does not happen in time (Raft's leader loop is itself stuck, e.g. in a
// log write on a stalled disk, so it cannot even start one), a TimeoutNow
// sent straight through the transport to the most up-to-date voter, which
// starts an election at once. Either is safe at any time: an election
// never loses a committed entry.
func (n *Node) stepDown(ctx context.Context) {
	r := n.cl.Raft
	fut := r.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	timer := time.NewTimer(n.transferWait())
	defer timer.Stop()
	select {
	case err := <-done:
		if err == nil {
			n.log.Info("leadership transferred")
			return
		}
		n.log.Warn("leadership transfer failed; forcing an election", "err", err)
	case <-timer.C:
		n.log.Warn("leadership transfer did not complete in time; forcing an election")
	case <-ctx.Done():
		return
	}
	if ctx.Err() != nil || r.State() != raft.Leader {
		return
	}
	for _, s := range n.electionTargets() {
		err := n.timeoutNow(s)
		if err == nil {
			n.log.Warn("forced an election: sent TimeoutNow", "to", s.ID)
			return
		}
		n.log.Warn("TimeoutNow failed", "to", s.ID, "err", err)
		if ctx.Err() != nil {
			return
		}
	}
}

// electionTargets are the other voters, the most up-to-date healthy ones
// first (as autopilot last saw them).
func (n *Node) electionTargets() []raft.Server {
	fut := n.cl.Raft.GetConfiguration()
	if fut.Error() != nil {
		return nil
	}
	var out []raft.Server
	for _, s := range fut.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID {
			out = append(out, s)
		}
	}
	type rank struct {
		healthy bool
		index   uint64
	}
	ranks := map[raft.ServerID]rank{}
	if st := n.apState.Load(); st != nil {
		for id, srv := range st.Servers {
			ranks[id] = rank{srv.Health.Healthy, srv.Stats.LastIndex}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := ranks[out[i].ID], ranks[out[j].ID]
		if a.healthy != b.healthy {
			return a.healthy
		}
		return a.index > b.index
	})
	return out
}

// timeoutNow tells s to start an election now, as the last step of a
// leadership transfer does, bounded by transferWait.
func (n *Node) timeoutNow(s raft.Server) error {
	tr := n.cl.Transport()
	req := &raft.TimeoutNowRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(n.cfg.NodeID),
			Addr: tr.EncodePeer(raft.ServerID(n.cfg.NodeID), n.cl.Addr)},
	}
	done := make(chan error, 1)
	go func() { done <- tr.TimeoutNow(s.ID, s.Address, req, &raft.TimeoutNowResponse{}) }()
	select {
	case err := <-done:
		return err
	case <-time.After(n.transferWait()):
		return errors.New("no answer in time")
	}
}

// tickLoop is the cluster clock. It waits one period after gaining
// leadership before the first tick (a new leader must not compress time;
// only a new cluster, at tick 0, starts its clock at once),
// proposes tick k+1 only after tick k has applied here, and never sooner
// than one period after it proposed tick k: committed ticks are therefore
// never closer than one period in real time, except that one tick may follow
// its predecessor quickly after a stall (fsm.GraceTicks covers it). Every
// tick it commits counts as progress for the watchdog.
func (n *Node) tickLoop(ctx context.Context, progress *termProgress) {
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
	ticked := false
	var lastCommit time.Time // of this term's previous tick
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		// Both cases may have been ready: a term that has ended must not
		// propose (a tick of an old loop committed in a later term would
		// crowd that term's first tick).
		if ctx.Err() != nil {
			return
		}
		sent := monoNow()
		n.rep.mu.RLock()
		next := n.rep.f.Tick() + 1
		n.rep.mu.RUnlock()
		_, _, err := n.propose(ctx, &fsm.Tick{Tick: next, WallMS: wallNow().UnixMilli(),
			PeriodMS: period.Milliseconds(), RetainTicks: retain, RetainMax: uint64(n.cfg.MaxRetained),
			ExpireMax: n.tickChunk()})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			n.log.Warn("tick not committed", "tick", next, "err", err)
		} else {
			if !ticked {
				n.log.Info("first tick of this leadership term committed", "tick", next)
				ticked = true
			}
			progress.mark()
			now := monoNow()
			if !lastCommit.IsZero() {
				n.metrics.tickInterval.Observe(now.Sub(lastCommit).Seconds())
			}
			lastCommit = now
			n.drainExpiry(ctx, next, progress)
		}
		timer.Reset(max(sent.Add(period).Sub(monoNow()), 0))
	}
}

// expireChunk bounds the records one tick or Expire entry ends (fsm
// expire.go): small enough that applying it holds writes up for a few
// milliseconds, large enough that a storm of 100,000 expiries takes few
// round trips. Tests set a smaller one (Config.expireChunk).
const expireChunk = 4096

// chunk is the records one tick or Expire entry ends.
func (n *Node) chunk() uint64 { return cmp.Or(n.cfg.expireChunk, expireChunk) }

// tickChunk is the ExpireMax of the next tick: the chunk once every server
// of the configuration runs a version that reads limited ticks and Expire
// entries (gossip says so; the leader's reconcile pass checks), else 0, an
// unlimited tick of the older entry type: a server of an earlier version
// stops on an entry type it does not know, so a rolling upgrade chunks
// expiries only once it is complete.
func (n *Node) tickChunk() uint64 {
	if !n.chunkedOK.Load() {
		return 0
	}
	return n.chunk()
}

// updateChunkedExpiry records whether every server of the configuration
// (ids) but this one announces ChunkedExpiry in gossip.
func (n *Node) updateChunkedExpiry(ids []string) {
	n.chunkedOK.Store(!n.cfg.olderPeer && everyPeer(n.cfg.NodeID, ids, n.mem.gossip.Peer, func(p cluster.Peer) bool { return p.ChunkedExpiry }))
}

// everyPeer reports whether every server of ids but self is known (peer)
// and has the capability has.
func everyPeer(self string, ids []string, peer func(string) (cluster.Peer, bool), has func(cluster.Peer) bool) bool {
	for _, id := range ids {
		if id == self {
			continue
		}
		if p, found := peer(id); !found || !has(p) {
			return false
		}
	}
	return true
}

// expireDepth is how many Expire entries drainExpiry keeps in flight: the
// next chunk commits while the one before applies, and a write proposed
// meanwhile waits behind at most this many chunks.
const expireDepth = 2

// drainExpiry proposes Expire entries, at most expireDepth at a time so
// that the writes proposed meanwhile commit between them, until what tick
// left due has ended (or the tick has passed, or leadership is lost).
func (n *Node) drainExpiry(ctx context.Context, tick uint64, progress *termProgress) {
	done := make(chan error, expireDepth)
	inflight := 0
	defer func() {
		for ; inflight > 0; inflight-- {
			<-done
		}
	}()
	for ctx.Err() == nil {
		n.rep.mu.RLock()
		left := 0
		if n.rep.f.Tick() == tick {
			left = n.rep.f.Backlog()
		}
		n.rep.mu.RUnlock()
		// Once a server that does not read Expire entries is in the
		// configuration, none is proposed: the next tick is unlimited
		// and ends what is left.
		if n.chunkedOK.Load() && uint64(left) > uint64(inflight)*n.chunk() && inflight < expireDepth {
			inflight++
			go func() {
				_, _, err := n.propose(ctx, &fsm.Expire{Tick: tick, WallMS: wallNow().UnixMilli(), Max: n.chunk()})
				done <- err
			}()
			continue
		}
		if inflight == 0 {
			return
		}
		err := <-done
		inflight--
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("expiry not committed", "tick", tick, "err", err)
			}
			return
		}
		// A committed chunk is this term's progress as much as a tick:
		// the watchdog must not hand on a leader draining a long storm.
		progress.mark()
	}
}

// period is the cluster's tick period.
func (n *Node) period() time.Duration {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return time.Duration(n.rep.period()) * time.Millisecond
}

// Close stops the node: Raft shuts down, subscriptions end, pending
// operations fail. Acknowledged writes are on disk already. When the log
// holds many entries since the last snapshot, it takes one first, so that
// the next start restores it instead of replaying them (snapshotOnClose).
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.closing)
		n.handOffOnClose()
		n.snapshotOnClose()
		n.closePeer()
		n.closeErr = n.cl.Close()
		n.mem.gossip.Close()
		n.hub.close()
		n.wg.Wait()
		n.stopClock()
	})
	return n.closeErr
}

// closeTransferWait bounds the leadership hand-off of a graceful stop.
var closeTransferWait = 5 * time.Second

// handOffOnClose hands leadership on before a leader stops, when another
// voter can take it: the batcher has stopped, so from here on this server
// would lead without accepting anything (for as long as the snapshot of
// snapshotOnClose takes), and the followers would wait an election
// timeout after it went. A failed or slow hand-off leaves the stop to go
// on as before.
func (n *Node) handOffOnClose() {
	r := n.cl.Raft
	if r == nil || r.State() != raft.Leader {
		return
	}
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return
	}
	others := false
	for _, s := range fut.Configuration().Servers {
		others = others || s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID
	}
	if !others {
		return
	}
	done := make(chan error, 1)
	go func() { done <- r.LeadershipTransfer().Error() }()
	t := time.NewTimer(closeTransferWait)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			n.log.Warn("leadership hand-off before stopping failed", "err", err)
		} else {
			n.log.Info("leadership handed on before stopping")
		}
	case <-t.C:
		n.log.Warn("leadership hand-off before stopping did not complete in time")
	}
}

// closeSnapshotHook, when set (tests), runs as snapshotOnClose starts.
var closeSnapshotHook func(*Node)

// Snapshot-on-close policy: at least closeSnapshotMin entries applied since
// the last snapshot, and no longer than closeSnapshotTimeout.
var (
	closeSnapshotMin     uint64 = 1024 // a variable for tests
	closeSnapshotTimeout        = 30 * time.Second
)

// snapshotOnClose has Raft snapshot the state before a graceful stop when
// at least closeSnapshotMin entries were applied since the last snapshot.
// A restart restores the latest snapshot and then replays the log after
// it: with a million leases, replaying the up to tens of thousands of
// batched entries that accumulate between automatic snapshots (the
// threshold is checked every --snapshot-interval) took longer than
// restoring the whole state (a snapshot takes a few seconds at that size).
// The snapshot is an optimisation: if it fails or takes longer than
// closeSnapshotTimeout the stop goes on, and a crash (no Close) replays as
// before.
func (n *Node) snapshotOnClose() {
	r := n.cl.Raft
	if r == nil {
		return
	}
	if closeSnapshotHook != nil {
		closeSnapshotHook(n)
	}
	last, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
	if err != nil || r.AppliedIndex() < last+closeSnapshotMin {
		return
	}
	done := make(chan error, 1)
	go func() { done <- r.Snapshot().Error() }()
	t := time.NewTimer(closeSnapshotTimeout)
	defer t.Stop()
	select {
	case err = <-done:
	case <-t.C:
		err = errors.New("timed out")
	}
	if err != nil {
		n.log.Warn("snapshot before stopping failed; the next start replays the log", "err", err)
	}
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
