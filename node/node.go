package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
	"github.com/prometheus/client_golang/prometheus"
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

	gc groupCommit // the batcher (propose.go)

	waits  waitList       // acquires waiting for a grant, by lease id
	queued queuedAcquires // waits for and withdraws queued acquires (queued.go)

	lt leaderTerm // what this server does while it leads (leading.go)
	tk ticker     // the cluster clock (tick.go)
	rc reconciler // the configuration's keeper (reconcile.go)
	// sc is the cross-server state check (statecheck.go); peerHTTP the
	// client of node-to-node requests (nil for an in-memory node).
	sc       stateCheck
	peerHTTP *http.Client

	bk  backups      // snapshots and restores (backup.go)
	ctl controlLease // the control lease's helpers (control.go)

	mem  *cluster.Members // gossip, joining, admission, the cluster identity (membership.go)
	seal sealer
	sg   sealGuard
	gk   *grantKeys                      // this server's grant signing key (grants.go)
	rot  *rotWatch                       // damaged log entries refused to followers (logcheck.go)
	clP  atomic.Pointer[cluster.Cluster] // set once Raft runs (gossip callbacks)

	stopClock func() // undoes startClock

	disk diskGuard // the free-space guard (diskguard.go)
	logs *logWatch // the log store's writes (logwatch.go)

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
	cfg = cfg.withDefaults()
	n, err := newNode(cfg)
	if err != nil {
		return nil, err
	}
	n.stopClock = startClock(n.log)
	cl, err := cluster.Open(consensusConfig(n), n.rep)
	if err != nil {
		n.mem.Close()
		n.stopClock()
		if errors.Is(err, cluster.ErrGossipClosed) {
			err = errClosed
		}
		return nil, err
	}
	n.attachCluster(cl)
	n.rep.started.Store(true) // restores from here on are installs or operator restores
	n.start()
	// A restart restored the latest snapshot already: a server whose
	// sealing key is not the one it records does not start. (One that
	// learns the check from the log later refuses to serve then.)
	if err := n.sg.checkSeal(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// newNode assembles a node's parts before Raft starts: the replica (the
// state machine Raft applies to), metrics, and the identities kept in the
// data directory.
func newNode(cfg Config) (*Node, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	closing := make(chan struct{})
	n := &Node{
		cfg: cfg, log: logger, hub: newHub(cfg.EventHistory), stats: newCounters(),
		waits: waitList{m: make(map[string][]chan fsm.Notice)}, ready: make(chan struct{}), closing: closing,
		logs: newLogWatch(cfg.logWriteHang, logger, closing),
	}
	n.gc = groupCommit{propCh: make(chan *proposal, 4096), inflight: make(chan struct{}, entriesInFlight)}
	n.rep = newReplica(n.hub, n.stats, n.waits.deliver)
	n.rep.corrupt = cfg.corruptEntry
	n.rep.skew = cfg.skewApply
	n.rep.skipRestore = cfg.SkipRestore
	n.metrics = newNodeMetrics(cfg.Registry, &n.cfg, n.rep, n.tk.period, &n.clP, n.applyStall)
	n.sc = stateCheck{cfg: &n.cfg, log: n.log, rep: n.rep, closing: n.closing, metrics: newStateCheckMetrics(n.metrics.reg), out: newOutSignal()}
	n.rot = newRotWatch(n.metrics.reg)
	n.rep.metrics = n.metrics
	n.rep.defaultPeriod = cfg.TickPeriod.Milliseconds()
	n.rep.leading = func() bool {
		c := n.clP.Load()
		return c != nil && c.IsLeader()
	}
	var err error
	if n.mem, err = newMembers(n); err != nil {
		return nil, err
	}
	if n.seal, err = newSealer(cfg); err != nil {
		return nil, err
	}
	if n.gk, err = loadGrantKey(cfg, n.log); err != nil {
		return nil, err
	}
	n.wireHelpers()
	return n, nil
}

// wireHelpers gives each helper the parts of the node it uses; those
// that use the consensus get it from attachCluster once Raft runs.
func (n *Node) wireHelpers() {
	n.bk = backups{cfg: &n.cfg, log: n.log, rep: n.rep, closing: n.closing, disk: &n.disk, mem: n.mem, gc: &n.gc, tk: &n.tk,
		noLeader: n.noLeader, featureOK: n.featureOK}
	n.tk = ticker{cfg: &n.cfg, log: n.log, rep: n.rep, metrics: n.metrics, propose: n.propose, recorded: n.recorded, featureOK: n.featureOK}
	n.rc = reconciler{cfg: &n.cfg, rep: n.rep, mem: n.mem, sg: &n.sg, tk: &n.tk, gc: &n.gc, gk: n.gk,
		recordFeatures: n.recordFeatures, admit: func(p cluster.Peer) error { return admitPeer(n.recorded, p) }, propose: n.propose}
	n.sg = sealGuard{seal: &n.seal, cfg: &n.cfg, log: n.log, rep: n.rep, mem: n.mem, propose: n.propose}
	n.ctl = controlLease{cfg: &n.cfg, rep: n.rep, tk: &n.tk, propose: n.propose}
	n.lt = leaderTerm{cfg: &n.cfg, log: n.log, rep: n.rep, mem: n.mem, refused: n.refusedErr, gc: &n.gc, bk: &n.bk, rc: &n.rc, sc: &n.sc, tk: &n.tk, propose: n.propose}
	n.gk.cfg, n.gk.log, n.gk.rep, n.gk.mem, n.gk.propose = &n.cfg, n.log, n.rep, n.mem, n.propose
	n.peer = peerServer{cfg: &n.cfg, closing: n.closing}
	n.gc.cfg, n.gc.rep, n.gc.stats, n.gc.wg, n.gc.closing = &n.cfg, n.rep, n.stats, &n.wg, n.closing
	n.gc.recorded, n.gc.featureOK = n.recorded, n.featureOK
	n.queued = queuedAcquires{cfg: &n.cfg, rep: n.rep, waits: &n.waits, tk: &n.tk, metrics: n.metrics, closing: n.closing, propose: n.propose}
	n.disk = diskGuard{cfg: &n.cfg, log: n.log, rep: n.rep, mem: n.mem, metrics: n.metrics, logs: n.logs, clP: &n.clP, wg: &n.wg, closing: n.closing}
}

// attachCluster hands the running consensus to the helpers that use it.
func (n *Node) attachCluster(cl *cluster.Cluster) {
	n.cl = cl
	n.clP.Store(cl)
	n.bk.cl = cl
	n.sc.cl = cl
	n.rc.cl = cl
	n.sg.cl = cl
	n.lt.cl = cl
	n.peer.cl = cl
	n.gc.cl = cl
}

// consensusConfig is the configuration of n's consensus.
func consensusConfig(n *Node) cluster.Config {
	cfg := n.cfg
	raftAdv := cfg.RaftAdvertise
	if host, _ := advertiseHost(cfg); raftAdv == "" && host != "" {
		// A name stays the Raft address (resolved on every dial: it
		// follows the server to a new IP); gossip takes the IP.
		raftAdv = withHost(cfg.RaftAddr, cmp.Or(cfg.AdvertiseAddr, host))
	}
	return cluster.Config{
		NodeID: cfg.NodeID, Dir: cfg.DataDir, LogStore: cfg.RaftLog, WALSegmentSize: cfg.WALSegmentSize, BindAddr: cfg.RaftAddr, Advertise: raftAdv,
		InMemory: cfg.InMemory, Bootstrap: cfg.BootstrapExpect <= 1 && len(cfg.Join) == 0,
		SnapshotThreshold: cfg.SnapshotThreshold, SnapshotInterval: cfg.SnapshotInterval, TrailingLogs: cfg.TrailingLogs,
		HeartbeatTimeout: cfg.RaftTimeout, ElectionTimeout: cfg.RaftTimeout, LeaderLeaseTimeout: cfg.RaftTimeout / 2,
		Logger: n.log, Members: n.mem, TLS: cfg.RaftTLS, WrapStream: cfg.WrapRaftStream, WrapTransport: cfg.WrapRaftTransport,
		WrapStores: checkedStores(n.logs, checkedLogs{clP: &n.clP, rep: n.rep, rot: n.rot, log: n.log}, chaosStores(cfg.WrapRaftStores)), LogEnd: func(last uint64) { n.rep.replayEnd.Store(last) }, SnapshotOpened: n.rep.snapshotOpened,
	}
}

// start runs what serves once Raft runs: the node-to-node routes and the
// state check at start, leadership's work, the disk guard, the batcher,
// readiness and membership.
func (n *Node) start() {
	if ln := n.cl.PeerListener(); ln != nil {
		n.peerHTTP = &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: n.DialPeer, MaxIdleConnsPerHost: 4,
			IdleConnTimeout: 90 * time.Second}}
		n.sc.peerHTTP, n.peer.peerHTTP = n.peerHTTP, n.peerHTTP
		n.peer.own = n.sc.internalHandler()
		n.peer.start()
		go n.sc.startupCheck()
	} else if n.cfg.peerHashHook != nil {
		go n.sc.startupCheck()
	} else {
		n.sc.startChecked.Store(true)
	}
	n.cl.OnLeadership(n.lt.run)
	n.disk.startDiskGuard()
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		n.metrics.countLeaderChanges(n.cl, n.closing)
	}()
	go n.gc.run()
	go n.watchReady()
	n.mem.Start(n.cl)
}

// Ready is closed once a leader is known and this node has applied up to it.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// ReadyErr is nil when a leader is known and this node has applied every
// entry committed when it last heard from it, and is not a frozen follower
// (applyStall); otherwise it says why not. It takes no lock a stuck apply
// could hold. Entries committed but not yet applied are waited for, up to
// readyCatchUp, so that readiness does not flap under load.
func (n *Node) ReadyErr() error {
	select {
	case <-n.closing:
		return &wire.Error{Code: wire.CodeUnavailable, Message: "node is shutting down"}
	default:
	}
	if err := n.refusedErr(); err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: err.Error()}
	}
	if err := n.HealthErr(); err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: err.Error()}
	}
	if err := n.sc.outOfService(); err != nil {
		return err
	}
	if addr, _ := n.cl.Leader(); addr == "" {
		return &wire.Error{Code: wire.CodeNoLeader, Message: "no leader is known"}
	}
	if n.cl.IsLeader() && !n.lt.isReady() {
		return &wire.Error{Code: wire.CodeNoLeader, Message: "leader has not yet applied its predecessors' entries"}
	}
	if reason := n.applyStall(); reason != "" {
		return &wire.Error{Code: wire.CodeUnavailable, Message: reason}
	}
	if commit := n.cl.CommitIndex(); !n.caughtUp(commit, readyCatchUp) {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "applying the log: not caught up with the leader yet"}
	}
	if n.rep.tick.Load() == 0 {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "the cluster clock has not started yet (no tick committed)"}
	}
	if !n.sc.startChecked.Load() {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "comparing this server's state with the leader's (state check at start)"}
	}
	return nil
}

// caughtUp waits up to within for this server to have applied every
// entry up to commit that its state machine sees (raftOnly), and reports
// whether it did.
func (n *Node) caughtUp(commit uint64, within time.Duration) bool {
	var timer *time.Timer
	for {
		ch, applied := n.rep.waitApplied()
		if applied >= commit || n.raftOnly(applied, commit) {
			return true
		}
		if timer == nil {
			timer = time.NewTimer(within)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		case <-n.closing:
			return false
		}
	}
}

// raftOnlyScan bounds the entries raftOnly reads.
const raftOnlyScan = 16

// raftOnly reports whether every log entry after index from up to index
// to is one Raft keeps to itself (its no-op, a barrier, a configuration
// change): the state machine never sees those, so a server that applied
// up to from has applied all it will of them until the next command. At
// most raftOnlyScan entries are read.
func (n *Node) raftOnly(from, to uint64) bool {
	if to <= from {
		return true
	}
	if to-from > raftOnlyScan || n.logs == nil {
		return false
	}
	s := n.logs.store.Load()
	if s == nil {
		return false
	}
	var l raft.Log
	for i := from + 1; i <= to; i++ {
		if err := s.GetLog(i, &l); err != nil || l.Type == raft.LogCommand {
			return false
		}
	}
	return true
}

// Cluster is this server's consensus (Raft state, configuration) for
// tooling and tests; the lease operations are Node's.
func (n *Node) Cluster() *cluster.Cluster { return n.cl }

// AppliedIndex is the Raft index of the last entry applied on this node.
func (n *Node) AppliedIndex() uint64 { return n.rep.applied.Load() }

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

// Close stops the node: Raft shuts down, subscriptions end, pending
// operations fail. Acknowledged writes are on disk already. When the log
// holds many entries since the last snapshot, it takes one first, so that
// the next start restores it instead of replaying them (snapshotOnClose).
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.closing)
		n.cl.HandOff()
		if n.FailedErr() == nil {
			// A failed node's disk is full or broken: no snapshot.
			n.snapshotOnClose()
		}
		n.peer.close()
		n.closeErr = n.cl.Close()
		n.mem.Close()
		n.hub.close()
		n.wg.Wait()
		n.stopClock()
	})
	return n.closeErr
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
// at least closeSnapshotMin entries were applied since the last snapshot,
// so that a restart restores it instead of replaying a long log. It is an
// optimisation: if it fails or takes longer than closeSnapshotTimeout the
// stop goes on.
func (n *Node) snapshotOnClose() {
	r := n.cl
	if r == nil {
		return
	}
	if closeSnapshotHook != nil {
		closeSnapshotHook(n)
	}
	last, err := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
	if err != nil || r.AppliedIndex() < last+closeSnapshotMin || canaryLoseTail {
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

var errClosed = errors.New("node closed")

// DiskLow reports whether this server's free disk space is below its
// threshold (the guard's view; false when it watches no disk).
func (n *Node) DiskLow() bool { return n.disk.low.Load() }

// Registry is this node's Prometheus registry: Go runtime and process
// collectors, build info, hashicorp/raft's metrics and the node's own. The
// HTTP API serves it on /metrics together with its own; an application may
// register more.
func (n *Node) Registry() *prometheus.Registry { return n.metrics.reg }

// HealthErr is nil while the node can serve at all; otherwise it says why
// not: Raft's log store fails its writes (a full or broken disk) or one
// of them hangs (for DefaultLogWriteHang), or the node has failed
// (Failed). /healthz answers 503 with it: a restart is what recovers it.
func (n *Node) HealthErr() error {
	if n.logs == nil {
		return nil
	}
	if p := n.logs.failErr.Load(); p != nil {
		return *p
	}
	if err := n.logs.failingErr(); err != nil {
		return err
	}
	return n.logs.hungErr()
}

// Failed is closed when the node has failed for good: Raft's log store
// stopped taking writes and cannot recover without reopening the log (see
// FailedErr). The process should then stop (Close) and be restarted; the
// server command exits with a distinct status. Acknowledged writes are on
// disk: a restart recovers them.
func (n *Node) Failed() <-chan struct{} {
	if n.logs == nil {
		return nil
	}
	return n.logs.failed
}

// FailedErr says why the node failed; nil while it has not.
func (n *Node) FailedErr() error {
	if n.logs == nil {
		return nil
	}
	if p := n.logs.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

// GrantKeyID is the key id (RFC 7638 thumbprint) of this server's grant
// signing key.
func (n *Node) GrantKeyID() string { return n.gk.kid() }

// ServePeer makes h the handler of the node-to-node requests other servers
// of the cluster send this one (the last call wins). Every request h gets
// comes from a server of this cluster (see DialPeer); none from a client.
// With InMemory there are no such requests.
func (n *Node) ServePeer(h http.Handler) {
	if n.cl.PeerListener() == nil {
		return
	}
	p := &n.peer
	p.mu.Lock()
	p.h = h
	p.mu.Unlock()
	n.peer.start()
}

// DialPeer opens a node-to-node stream to the server whose Raft address is
// addr (LeaderInfo.RaftAddr): network must be "tcp" (as a
// net.Dialer.DialContext, so that an http.Transport can use it; the
// request's host is then the Raft address). The stream passes the checks
// of the Raft port.
func (n *Node) DialPeer(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, errors.New("node: node-to-node streams are TCP")
	}
	conn, err := n.cl.DialPeer(ctx, addr)
	if err != nil {
		// Nothing was sent: a dial error, as the forwarders tell it apart.
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	return conn, nil
}

// applyStall is the reason this server is a frozen follower, or "".
func (n *Node) applyStall() string {
	r := n.clP.Load()
	if r == nil {
		return ""
	}
	timeout := n.cfg.applyStallTimeout()
	stalled := n.rep.sinceMoved()
	if stalled < timeout || r.IsLeader() {
		return "" // the cheap test first: a healthy follower stops here
	}
	_, leader := r.Leader()
	v := stallView{stalled: stalled, applied: n.rep.applied.Load(), commit: r.CommitIndex(),
		lastIndex: r.LastIndex(), leader: string(leader), contact: -1}
	if n.raftOnly(v.applied, v.commit) {
		v.commit = v.applied // only entries the state machine never sees (a barrier) are ahead
	}
	if lc := r.LastContact(); !lc.IsZero() {
		v.contact = time.Since(lc)
	}
	if leader != "" && n.mem.Gossip() != nil {
		if p, ok := n.mem.Gossip().Peer(string(leader)); ok && p.Stats != nil && time.Since(p.StatsAt) < timeout {
			v.leaderIndex, v.leaderIndexOK = p.Stats.LastIndex, true
		}
	}
	return stallReason(v, timeout)
}

// Service returns this server's service state and, unless it is serving,
// why. It takes no lock a stuck apply could hold.
func (n *Node) Service() (ServiceState, string) {
	if st, why := n.outState(); st != "" {
		return st, why
	}
	if err := n.HealthErr(); err != nil {
		return ServiceDiskFull, err.Error()
	}
	if n.disk.low.Load() {
		return ServiceDiskFull, "the free-space guard refuses growth: the data directory's disk is low"
	}
	if n.bk.restoreBusy(0) {
		return ServiceRestoring, "a restore is being applied"
	}
	if !n.sc.startChecked.Load() {
		return ServiceCatchingUp, "comparing this server's state with the others' (state check at start)"
	}
	if addr, _ := n.cl.Leader(); addr == "" {
		return ServiceCatchingUp, "no leader is known"
	}
	if applied, commit := n.rep.applied.Load(), n.cl.CommitIndex(); applied < commit && !n.raftOnly(applied, commit) {
		return ServiceCatchingUp, "applying the log: not caught up with the leader yet"
	}
	return ServiceServing, ""
}

// Gate is the one check every request path goes through: nil while this
// server may serve, else 503 OUT_OF_SERVICE naming the state and why. It
// costs a serving server a few atomic loads and one uncontended lock.
func (n *Node) Gate() error {
	if st, why := n.outState(); st != "" {
		return errOutOfService(st, why)
	}
	return nil
}

// outState is the state that takes this server out of service and why,
// or "" when none does; cheapest first.
func (n *Node) outState() (ServiceState, string) {
	if err := n.refusedErr(); err != nil {
		return ServiceRemoved, err.Error()
	}
	if msg := n.rep.broken.Load(); msg != nil {
		return ServiceDamaged, *msg
	}
	if msg := n.sc.diverged.Load(); msg != nil {
		return ServiceDiverged, *msg
	}
	if reason := n.applyStall(); reason != "" {
		return ServiceFrozen, reason
	}
	return "", ""
}

func (n *Node) noLeader() error {
	msg := "this node is not the leader and no leader is known"
	if _, id := n.cl.Leader(); string(id) == n.cfg.NodeID {
		msg = "this node was just elected leader and is still applying its predecessors' entries; retry shortly"
	} else if addr, id := n.cl.Leader(); addr != "" {
		msg = "this node is not the leader; the leader is " + string(id) + " at " + string(addr)
	}
	return &wire.Error{Code: wire.CodeNoLeader, Message: msg}
}
