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
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"
)

// Config configures the Raft side of a server.
type Config struct {
	// NodeID is this server's Raft id.
	NodeID string
	// Dir holds wal/ (the log), raft.db (the stable store; its lock keeps
	// a second server off the directory) and snapshots/.
	Dir string
	// BindAddr is the TCP address the Raft transport listens on.
	BindAddr string
	// Advertise is the address peers dial; empty means BindAddr.
	Advertise string
	// InMemory uses in-memory stores and transport (tests only).
	InMemory bool
	// Bootstrap forms a new single-server cluster when there is no existing
	// Raft state. A server with existing state never bootstraps again.
	Bootstrap bool
	// SnapshotThreshold and SnapshotInterval: see raft.Config.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// TrailingLogs kept after a snapshot. Default 10240.
	TrailingLogs uint64
	// HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout: Raft timing,
	// tuned for a LAN. Defaults 500ms, 500ms, 250ms.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// Logger receives Raft's logs.
	Logger *slog.Logger
	// TLS, if set, runs Raft traffic over mutual TLS (see TLSConfig);
	// nil: plain TCP.
	TLS *TLSConfig
	// BeforeStart, if set, runs once the stores are open (and a single
	// server bootstrapped), before Raft starts: hadState tells whether Raft
	// state existed, addr is the address the others dial. An error stops
	// Open.
	BeforeStart func(hadState bool, addr raft.ServerAddress) error
	// LogEnd, if set, is told the last index of the stored log before Raft
	// starts: entries up to it that Raft applies are the startup's replay.
	LogEnd func(last uint64)
	// WrapStream, if set, wraps the Raft stream layer (every connection
	// Raft accepts or dials) for embedders that route, shape or observe
	// the traffic between servers themselves. It gets the layer in use
	// and returns the one Raft uses; Addr must still be the address peers
	// dial. Not used with InMemory. The node-to-node streams (PeerListener,
	// DialPeer) are told apart beneath it, by the identity layer, and do
	// not pass through it.
	WrapStream func(raft.StreamLayer) raft.StreamLayer
	// WrapStores, if set, wraps Raft's log and stable stores (fault
	// injection: see internal/diskfault). Reads and writes must reach the
	// stores it is given.
	WrapStores func(raft.LogStore, raft.StableStore) (raft.LogStore, raft.StableStore)
	// Identity, if set, makes every Raft connection start with an exchange
	// of cluster ids (see Identity): servers of two clusters never
	// exchange Raft traffic. It wraps the TLS or TCP layer, inside
	// WrapStream. Not used with InMemory.
	Identity *Identity
}

// Cluster is one running Raft server.
type Cluster struct {
	Raft *raft.Raft
	// HadState: Raft state existed when Open ran (this server belongs, or
	// belonged, to a cluster).
	HadState bool
	// Addr is this server's Raft address as the others dial it.
	Addr raft.ServerAddress

	cfg       Config
	trans     raft.Transport
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
}

// ErrInvalidConfig wraps configuration problems found by Open.
var ErrInvalidConfig = errors.New("cluster: invalid config")

// Open starts Raft with fsm. It returns once Raft runs; leadership comes
// later (see OnLeadership and raft.Raft.Leader).
func Open(cfg Config, fsm raft.FSM) (*Cluster, error) {
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("%w: node id is required", ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 500 * time.Millisecond
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = 500 * time.Millisecond
	}
	if cfg.LeaderLeaseTimeout == 0 {
		cfg.LeaderLeaseTimeout = 250 * time.Millisecond
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 10240
	}
	c := &Cluster{cfg: cfg, logger: cfg.Logger, notifyCh: make(chan bool, 16),
		stop: make(chan struct{}), done: make(chan struct{})}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = 256
	rc.BatchApplyCh = true
	rc.TrailingLogs = cfg.TrailingLogs
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.SnapshotInterval > 0 {
		rc.SnapshotInterval = cfg.SnapshotInterval
	}
	rc.NotifyCh = c.notifyCh
	rc.Logger = newHCLogger("raft", cfg.Logger)

	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
		addr   raft.ServerAddress
	)
	if cfg.InMemory {
		store := raft.NewInmemStore()
		logs, stable = store, store
		snaps = newMemSnapshots()
		a, t := raft.NewInmemTransport(raft.ServerAddress(cfg.NodeID))
		addr, c.trans = a, t
	} else {
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("cluster: data dir: %w", err)
		}
		// fsync stays on (NoSync false). The freelist is not synced on every
		// commit (bbolt rebuilds it on open) and a large initial mmap avoids
		// remapping stalls as the log grows.
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.Dir, "raft.db"),
			BoltOptions: &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true,
				FreelistType: bbolt.FreelistMapType, InitialMmapSize: 64 << 20}})
		if errors.Is(err, bberrors.ErrTimeout) {
			return nil, fmt.Errorf("cluster: %s is locked: is another leasehold server using data dir %s?", filepath.Join(cfg.Dir, "raft.db"), cfg.Dir)
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: open raft.db: %w", err)
		}
		c.closers = append(c.closers, bolt)
		fss, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, newHCLogger("snapshot", cfg.Logger))
		if err != nil {
			c.closeStores()
			return nil, fmt.Errorf("cluster: snapshot store: %w", err)
		}
		snaps = fss
		// The newest snapshot that opens is the one Raft restores (it
		// skips those that do not): the log move counts on it.
		var snapIndex uint64
		metas, _ := fss.List()
		for _, m := range metas {
			if _, rc, err := fss.Open(m.ID); err == nil {
				rc.Close()
				snapIndex = m.Index
				break
			}
		}
		wal, err := openLogStore(cfg.Dir, bolt, snapIndex, cfg.Logger)
		if err != nil {
			c.closeStores()
			return nil, err
		}
		c.closers = append(c.closers, wal)
		cache, err := raft.NewLogCache(1024, wal)
		if err != nil {
			c.closeStores()
			return nil, err
		}
		logs, stable = cache, bolt
		adv := cfg.Advertise
		if adv == "" {
			adv = cfg.BindAddr
		}
		tcpAdv, err := net.ResolveTCPAddr("tcp", adv)
		if err != nil {
			c.closeStores()
			return nil, fmt.Errorf("cluster: advertise address %q: %w", adv, err)
		}
		if tcpAdv.IP == nil || tcpAdv.IP.IsUnspecified() {
			c.closeStores()
			return nil, fmt.Errorf("%w: advertise address %q is not reachable by peers; set an advertise address", ErrInvalidConfig, adv)
		}
		stream, err := newStreamLayer(cfg, tcpAdv)
		if err != nil {
			c.closeStores()
			return nil, err
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
		// Pipelined replication (MaxRPCsInFlight 2, raft's default: the
		// next AppendEntries is prepared and sent while the previous one is
		// answered) goes through pipelineTransport, which keeps a follower
		// that rejects an append from wedging its replication stream
		// (hashicorp/raft#612; the chaos suite's leadership-transfer storm
		// hit it before, and TestPipelineSurvivesRejectedAppends does).
		nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: wrapped, MaxPool: 8,
			MaxRPCsInFlight: raftMaxRPCsInFlight, Timeout: 10 * time.Second, Logger: newHCLogger("transport", cfg.Logger)})
		t := &pipelineTransport{nt}
		c.trans, c.stream = t, stream
		addr = nt.LocalAddr()
	}

	if cfg.WrapStores != nil {
		logs, stable = cfg.WrapStores(logs, stable)
	}
	if !cfg.InMemory {
		logs = monotonicLogs{logs}
	}
	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		c.closeAll()
		return nil, fmt.Errorf("cluster: inspect state: %w", err)
	}
	c.HadState, c.Addr = existing, addr
	if !existing && cfg.Bootstrap {
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: addr}}}
		if err := raft.BootstrapCluster(rc, logs, stable, snaps, c.trans, conf); err != nil {
			c.closeAll()
			return nil, fmt.Errorf("cluster: bootstrap: %w", err)
		}
		c.logger.Info("bootstrapped a new cluster", "node_id", cfg.NodeID, "raft_addr", addr)
	}
	if cfg.BeforeStart != nil {
		if err := cfg.BeforeStart(existing, addr); err != nil {
			c.closeAll()
			return nil, err
		}
	}
	if cfg.LogEnd != nil {
		last, err := logs.LastIndex()
		if err != nil {
			c.closeAll()
			return nil, fmt.Errorf("cluster: read the log's last index: %w", err)
		}
		cfg.LogEnd(last)
	}
	r, err := raft.NewRaft(rc, fsm, logs, stable, snaps, c.trans)
	if err != nil {
		c.closeAll()
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	c.Raft = r
	go c.watchLeadership()
	return c, nil
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

// BootstrapWith forms a new cluster of the given voters. It fails when
// this server has Raft state already; every server of a new cluster must
// call it with the same configuration (see node's bootstrap-expect).
func (c *Cluster) BootstrapWith(servers []raft.Server) error {
	if err := c.Raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		return fmt.Errorf("cluster: bootstrap: %w", err)
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
		if c.Raft != nil {
			err = c.Raft.Shutdown().Error()
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
