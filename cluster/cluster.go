package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// Cluster is one running Raft server.
type Cluster struct {
	raft *raft.Raft
	// HadState: Raft state existed when Open ran (this server belongs, or
	// belonged, to a cluster).
	HadState bool
	// Addr is this server's Raft address as the others dial it.
	Addr string

	cfg       Config
	trans     raft.Transport
	gate      *snapshotGate    // see candsnap.go
	stream    raft.StreamLayer // nil with InMemory
	idl       *identityLayer   // nil with InMemory or without Identity
	peerLn    *peerListener
	closers   []io.Closer
	notifyCh  chan bool
	logger    *slog.Logger
	mu        sync.Mutex
	handlers  []func(context.Context)
	cancel    context.CancelFunc // of the current leadership term; nil when not leader
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	watchdogStepDowns atomic.Int64
	failed            failures                        // when servers of the configuration were first missed (reconcile.go)
	refused           refusals                        // why new servers were last refused (reconcile.go)
	apState           atomic.Pointer[autopilot.State] // autopilot's latest view (leader only)
}

// stores are Raft's log, stable and snapshot stores.
type stores struct {
	logs   raft.LogStore
	stable raft.StableStore
	snaps  raft.SnapshotStore
}

// Open starts Raft with fsm. It returns once Raft runs; leadership comes
// later (see OnLeadership and Leader).
func Open(cfg Config, fsm raft.FSM) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Members != nil && cfg.Identity == nil {
		cfg.Identity = cfg.Members.identity()
	}
	c := &Cluster{cfg: cfg, logger: cfg.Logger, notifyCh: make(chan bool, 16),
		stop: make(chan struct{}), done: make(chan struct{})}
	rc := cfg.raftConfig(c.notifyCh)
	var (
		st   stores
		addr raft.ServerAddress
		err  error
	)
	if cfg.InMemory {
		store := raft.NewInmemStore()
		st = stores{logs: store, stable: store, snaps: newMemSnapshots()}
		// Raft's default of 500 ms per in-memory RPC counts a late vote
		// as refused, and a saturated machine then elects no leader.
		a, t := raft.NewInmemTransportWithTimeout(raft.ServerAddress(cfg.NodeID), max(500*time.Millisecond, 2*cfg.HeartbeatTimeout))
		gt := newGatedInmem(t)
		addr, c.trans, c.gate = a, gt, gt.gate
	} else {
		if st, err = c.openStores(); err != nil {
			c.closeStores()
			return nil, err
		}
		if addr, err = c.openTransport(); err != nil {
			c.closeStores()
			return nil, err
		}
	}
	if cfg.WrapTransport != nil {
		c.trans = cfg.WrapTransport(c.trans)
	}
	if cfg.WrapStores != nil {
		st.logs, st.stable = cfg.WrapStores(st.logs, st.stable)
	}
	if !cfg.InMemory {
		st.logs = &gaplessLogs{LogStore: st.logs}
	}
	if cfg.SnapshotOpened != nil {
		st.snaps = openedSnapshots{SnapshotStore: st.snaps, opened: cfg.SnapshotOpened}
	}
	if err := c.prepare(rc, st, addr); err != nil {
		c.closeAll()
		return nil, err
	}
	r, err := newRaft(rc, fsm, st.logs, st.stable, st.snaps, c.trans)
	if err != nil {
		c.closeAll()
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	c.raft = r
	if c.gate != nil {
		c.gate.setRaft(r)
	}
	c.campaignIfAlone()
	go c.watchLeadership()
	return c, nil
}

// campaignIfAlone has Raft start an election at once when this server is
// the only voter of its latest configuration (a single-server cluster,
// new or restarted), rather than after a heartbeat timeout or two. Raft has
// no call to campaign: lowering the heartbeat timeout (ReloadConfig) wakes
// the follower's timer, and the timeout is set back at once. With other
// voters nothing changes: they may have a leader this server has not
// heard from yet.
func (c *Cluster) campaignIfAlone() {
	conf, err := c.raftConfiguration()
	if err != nil || !onlyVoter(conf, raft.ServerID(c.cfg.NodeID)) {
		return
	}
	rc := c.raft.ReloadableConfig()
	lower := rc
	lower.HeartbeatTimeout--
	if err := c.raft.ReloadConfig(lower); err != nil {
		// A heartbeat timeout already at the leader lease timeout: Raft
		// refuses a lower one, and the timer runs its course.
		c.logger.Debug("raft: no early campaign", "error", err)
		return
	}
	if err := c.raft.ReloadConfig(rc); err != nil {
		c.logger.Warn("raft: could not set the heartbeat timeout back", "error", err)
	}
}

// onlyVoter reports whether id is the one voter of conf.
func onlyVoter(conf raft.Configuration, id raft.ServerID) bool {
	voters, self := 0, false
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == id
		}
	}
	return voters == 1 && self
}

// openStores opens the data directory's stores: raft.db first (its lock,
// then its data format, checked before anything in the directory is
// written or anything else opened), the snapshots, the log.
func (c *Cluster) openStores() (stores, error) {
	cfg := c.cfg
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return stores{}, fmt.Errorf("cluster: data dir: %w", err)
	}
	bolt, format, err := openBolt(filepath.Join(cfg.Dir, "raft.db"))
	if isLocked(err) {
		return stores{}, fmt.Errorf("cluster: %s is locked: is another leasehold server using data dir %s?", filepath.Join(cfg.Dir, "raft.db"), cfg.Dir)
	}
	if err != nil {
		return stores{}, err
	}
	c.closers = append(c.closers, bolt)
	fss, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, newHCLogger("snapshot", cfg.Logger))
	if err != nil {
		return stores{}, fmt.Errorf("cluster: snapshot store: %w", err)
	}
	wal, closer, err := openLogs(cfg.Dir, bolt, format, cfg.LogStore, cfg.WALSegmentSize, cfg.Logger)
	if err != nil {
		return stores{}, err
	}
	c.closers = append(c.closers, closer)
	cache, err := raft.NewLogCache(1024, wal)
	if err != nil {
		return stores{}, err
	}
	return stores{logs: cache, stable: bolt, snaps: fss}, nil
}

// openTransport opens the Raft port: TCP (or TLS), the cluster identity
// exchange, the embedder's wrapper, and the network transport on top. It
// returns the address the others dial.
func (c *Cluster) openTransport() (raft.ServerAddress, error) {
	cfg := c.cfg
	adv := cfg.Advertise
	if adv == "" {
		adv = cfg.BindAddr
	}
	tcpAdv, err := net.ResolveTCPAddr("tcp", adv)
	if err != nil {
		return "", fmt.Errorf("cluster: advertise address %q: %w", adv, err)
	}
	if tcpAdv.IP == nil || tcpAdv.IP.IsUnspecified() {
		return "", fmt.Errorf("%w: advertise address %q is not reachable by peers; set an advertise address", ErrInvalidConfig, adv)
	}
	var advAddr net.Addr = tcpAdv
	if host, _, err := net.SplitHostPort(adv); err == nil && host != "" && net.ParseIP(host) == nil {
		// A name stays the address peers dial, resolved on every dial,
		// so that it follows the server to a new IP.
		advAddr = nameAddr(adv)
	}
	stream, err := newStreamLayer(cfg, advAddr)
	if err != nil {
		return "", err
	}
	var wrapped raft.StreamLayer = stream
	if cfg.Identity != nil {
		c.idl = newIdentityLayer(wrapped, *cfg.Identity, cfg.Logger.With("component", "raft-identity"))
		c.peerLn = &peerListener{s: c.idl, closed: make(chan struct{})}
		wrapped = c.idl
	}
	if cfg.WrapStream != nil {
		wrapped = cfg.WrapStream(wrapped)
	}
	// pipelineTransport keeps a follower that rejects a pipelined append
	// from wedging its replication stream (hashicorp/raft#612).
	nt := newNetworkTransport(wrapped, cfg)
	pt := newPipelineTransport(nt)
	c.trans, c.stream, c.gate = pt, stream, pt.gate
	return nt.LocalAddr(), nil
}

// prepare runs the steps between opening the stores and starting Raft:
// note whether state exists, bootstrap a new single server when asked,
// the embedder's BeforeStart, and LogEnd.
func (c *Cluster) prepare(rc *raft.Config, st stores, addr raft.ServerAddress) error {
	cfg := c.cfg
	existing, err := raft.HasExistingState(st.logs, st.stable, st.snaps)
	if err != nil {
		return fmt.Errorf("cluster: inspect state: %w", err)
	}
	c.HadState, c.Addr = existing, string(addr)
	if !existing && cfg.Bootstrap {
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: addr}}}
		if err := raft.BootstrapCluster(rc, st.logs, st.stable, st.snaps, c.trans, conf); err != nil {
			return fmt.Errorf("cluster: bootstrap: %w", err)
		}
		c.logger.Info("bootstrapped a new cluster", "node_id", cfg.NodeID, "raft_addr", addr)
	}
	if cfg.BeforeStart != nil {
		if err := cfg.BeforeStart(existing, string(addr)); err != nil {
			return err
		}
	}
	if cfg.Members != nil {
		if err := cfg.Members.startGossip(existing, string(addr)); err != nil {
			return err
		}
	}
	if cfg.LogEnd != nil {
		last, err := st.logs.LastIndex()
		if err != nil {
			return fmt.Errorf("cluster: read the log's last index: %w", err)
		}
		cfg.LogEnd(last)
	}
	return nil
}

// PeerListener accepts the node-to-node streams other servers of this
// cluster open to this one (DialPeer): connections to the Raft port that
// passed its checks (mutual TLS when Raft TLS is on, the cluster id
// exchange) and carry HTTP between servers instead of Raft. Nil with
// InMemory or without Identity. Closing it leaves Raft running.
func (c *Cluster) PeerListener() net.Listener {
	if c.peerLn == nil {
		return nil
	}
	return c.peerLn
}

// DialPeer opens a node-to-node stream to the server whose Raft address is
// addr (see PeerListener), through the same checks as Raft's own
// connections. It fails at once with InMemory or without Identity.
func (c *Cluster) DialPeer(ctx context.Context, addr string) (net.Conn, error) {
	if c.idl == nil {
		return nil, errors.New("cluster: no node-to-node streams (in-memory transport or no identity)")
	}
	timeout := identityTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		conn, err := c.idl.dialPeer(raft.ServerAddress(addr), timeout)
		ch <- res{conn, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// BootstrapWith forms a new cluster of the given servers. It fails when
// this server has Raft state already; every server of a new cluster must
// call it with the same configuration (see bootstrap-expect, Members).
func (c *Cluster) BootstrapWith(servers []Server) error {
	rs := make([]raft.Server, len(servers))
	for i, s := range servers {
		rs[i] = s.raft()
	}
	if err := c.bootstrap(rs); err != nil {
		return err
	}
	c.logger.Info("bootstrapped a new cluster", "node_id", c.cfg.NodeID, "servers", len(servers))
	return nil
}

// Transport returns the Raft transport (tests connect in-memory transports).
func (c *Cluster) Transport() raft.Transport { return c.trans }

// OnLeadership registers fn to run, in its own goroutine, each time this
// server becomes leader. Its context is cancelled the moment leadership is
// lost or the cluster closes. Register before leadership can arrive (right
// after Open) to see the first term.
func (c *Cluster) OnLeadership(fn func(ctx context.Context)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers = append(c.handlers, fn)
	if c.cancel != nil {
		ctx, cancel := context.WithCancel(context.Background())
		prev := c.cancel
		c.cancel = func() { prev(); cancel() }
		go fn(ctx)
	}
}

func (c *Cluster) watchLeadership() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			c.setLeader(false)
			return
		case isLeader := <-c.notifyCh:
			c.setLeader(isLeader)
		}
	}
}

func (c *Cluster) setLeader(isLeader bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
	if !isLeader {
		return
	}
	c.logger.Info("gained leadership", "node_id", c.cfg.NodeID)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	for _, fn := range c.handlers {
		go fn(ctx)
	}
}

// Close shuts Raft down and closes the stores. It is safe to call twice.
func (c *Cluster) Close() error {
	var err error
	c.closeOnce.Do(func() {
		if c.raft != nil {
			err = c.raft.Shutdown().Error()
			close(c.stop)
			<-c.done
		}
		c.closeAll()
	})
	return err
}

func (c *Cluster) closeAll() {
	if cl, ok := c.trans.(io.Closer); ok {
		cl.Close()
	}
	if c.gate != nil {
		c.gate.close()
	}
	c.closeStores()
}

// closeStores closes the stores in the reverse order of opening: raft.db,
// whose lock guards the data dir, last.
func (c *Cluster) closeStores() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i].Close()
	}
	c.closers = nil
}

// newRaft is raft.NewRaft, with the panics it raises on a log or snapshots
// that do not fit together (a snapshot that failed its CRC check, whose
// predecessor needs log entries compacted long ago: "log not found")
// turned into an error that says what to do, instead of a crash.
func newRaft(rc *raft.Config, fsm raft.FSM, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore,
	trans raft.Transport) (r *raft.Raft, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("the Raft state in the data directory does not fit together (%v): "+
				"a snapshot or the log is damaged (the log says which); move the data directory aside and let this server rejoin empty", p)
		}
	}()
	return raft.NewRaft(rc, fsm, logs, stable, snaps, trans)
}
