package cluster

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Members is the one owner of this server's place in the cluster: it
// starts gossip, joins (and joins again), forms a cluster with
// bootstrap-expect, decides whether a new or wiped server may take Raft
// traffic (admission), learns that the cluster removed or refused it, and
// keeps the cluster identity (the data directory's copy, the replicated
// one, and recording one on the leader). The server lends it what it keeps
// in its replicated state: the member registry (Registry), the replicated
// cluster id (IDStore), the features it announces (Meta) and its resources
// (Resources). See DESIGN.md, Membership.
type Members struct {
	cfg         MembersConfig
	local       *LocalID
	incarnation string
	log         *slog.Logger

	c        atomic.Pointer[Cluster] // set by Start
	raftAddr string                  // as the others dial it; set before gossip starts
	gossip   *Gossip                 // set before Raft starts

	hadState   atomic.Bool  // Raft state exists (gossiped)
	gated      atomic.Int64 // unix ns of the last Raft connection admit refused
	conflictAt atomic.Int64 // unix ns of the last Raft connection refused for another cluster

	mu      sync.Mutex
	remote  *clusterView // last view merged from a server with state
	refused error        // set when the cluster removed or refused this server
	changed chan struct{}

	wg        sync.WaitGroup
	closeOnce sync.Once
}

// IDStore is where the replicated cluster id lives: the server's state
// machine.
type IDStore interface {
	// ClusterID is the id the state records; "" while it has none.
	ClusterID() string
	// ProposeClusterID records id through the log and returns once it
	// applied (or failed).
	ProposeClusterID(ctx context.Context, id string) error
}

// MembersConfig configures Members.
type MembersConfig struct {
	// NodeID is this server's id.
	NodeID string
	// Dir is the data directory, where the cluster id (cluster-id) and the
	// incarnation are kept; "" keeps them in memory.
	Dir string
	// ValidClusterID checks the data directory's cluster id.
	ValidClusterID func(string) error
	// GossipAddr is the gossip bind address; Advertise the host the others
	// reach it at ("" the bind host).
	GossipAddr, Advertise string
	// GossipKey, FastGossip, WrapGossip: see GossipConfig's Key, Fast and
	// WrapTransport.
	GossipKey  []byte
	FastGossip bool
	WrapGossip func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// Join are gossip addresses of servers of the cluster; JoinTimeout
	// bounds a new server's first join (without BootstrapExpect).
	Join        []string
	JoinTimeout time.Duration
	// BootstrapExpect > 1: a new server waits until that many new servers
	// see each other and forms the cluster with them.
	BootstrapExpect int
	// Registry is the member registry (replicated state).
	Registry Registry
	// IDs is the replicated cluster id.
	IDs IDStore
	// Meta returns what the server announces besides its identity (HTTP
	// address, version, the features it reads); Members fills ID, Raft,
	// Incarnation, Expect, HasState, ClusterID and RaftHello.
	Meta func() Meta
	// Resources returns the server's disk and memory figures for ping
	// acks (DiskLow, DiskFree, MemLimit); Members fills the Raft view.
	Resources func() PeerStats
	// OnPass, if set, runs on every pass of the membership loop (about
	// every 250 ms), after the cluster id is synced.
	OnPass func()
	// Stop is closed when the server stops: the loop ends and a first
	// join still waiting gives up (ErrGossipClosed).
	Stop   <-chan struct{}
	Logger *slog.Logger
}

// NewMembers reads the data directory's identity (cluster id,
// incarnation). Gossip starts with Raft (Config.Members), the loop with
// Start.
func NewMembers(cfg MembersConfig) (*Members, error) {
	inc, err := LoadIncarnation(cfg.Dir)
	if err != nil {
		return nil, err
	}
	local, err := OpenLocalID(cfg.Dir, cfg.ValidClusterID)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Members{cfg: cfg, local: local, incarnation: inc, log: cfg.Logger, changed: make(chan struct{}, 1)}, nil
}

// Incarnation is the random id of this server's data directory.
func (m *Members) Incarnation() string { return m.incarnation }

// Gossip is the running gossip (nil before Raft opened).
func (m *Members) Gossip() *Gossip { return m.gossip }

// Changed receives after gossip membership changes (one pending signal).
func (m *Members) Changed() <-chan struct{} { return m.changed }

// HasState reports whether this server has Raft state (it belongs, or
// belonged, to a cluster).
func (m *Members) HasState() bool { return m.hadState.Load() }

func (m *Members) membershipChanged() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Start runs the membership loop over c (the Cluster that Open started
// with these Members) until Stop is closed.
func (m *Members) Start(c *Cluster) {
	m.c.Store(c)
	m.wg.Add(1)
	go m.watch(c)
}

// Close stops gossip and waits for the loop (Stop must be closed first)
// and the exchanges it started.
func (m *Members) Close() {
	m.closeOnce.Do(func() {
		if m.gossip != nil {
			m.gossip.Close()
		}
		m.wg.Wait()
	})
}

// watch keeps the gossip metadata current (whether this server has Raft
// state) and, for a new server started with BootstrapExpect > 1, forms the
// cluster once enough servers see each other.
func (m *Members) watch(c *Cluster) {
	defer m.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	cfg := m.cfg
	// A server with Raft state (restarted) joins too: the others may all
	// have restarted as well, or have given it up as failed long ago, and
	// without gossip it knows no peer's HTTP address (nothing is forwarded)
	// and never learns that it was removed.
	joined := len(cfg.Join) == 0
	var lastJoin, lastRefresh time.Time
	for {
		select {
		case <-cfg.Stop:
			return
		case <-t.C:
		case <-m.changed:
		}
		if !m.hadState.Load() && c.LastIndex() > 0 {
			m.hadState.Store(true)
			m.gossip.UpdateMeta()
		}
		m.syncClusterID()
		if cfg.OnPass != nil {
			cfg.OnPass()
		}
		// Exchange gossip state every second while this server is gated
		// (no state, refused Raft traffic: admitRaft), in conflict (a peer
		// of another cluster) or moved (its leader does not list its new
		// address yet), so that gossip learns of it; and every 5 s while a
		// server of the configuration is not alive in gossip (one that
		// restarted without --join finds nobody by itself).
		gated := !m.hadState.Load() && time.Since(time.Unix(0, m.gated.Load())) < 3*time.Second
		conflict := time.Since(time.Unix(0, m.conflictAt.Load())) < 3*time.Second
		if (gated || conflict || c.moved()) && time.Since(lastRefresh) > time.Second || time.Since(lastRefresh) > 5*time.Second && c.missingServer(m.gossip) {
			lastRefresh = time.Now()
			m.refreshGossip()
		}
		// Join at start, and again (every 2 s) whenever gossip sees no
		// other server: after a partition longer than gossip remembers
		// failed servers, nobody would contact anybody otherwise.
		if len(cfg.Join) > 0 && (!joined || m.gossip.Alive() <= 1 && time.Since(lastJoin) > 2*time.Second) {
			lastJoin = time.Now()
			if k, _ := m.gossip.Join(cfg.Join); k > 0 {
				joined = true
			}
		}
		if !m.hadState.Load() && cfg.BootstrapExpect > 1 {
			m.tryBootstrap(c)
		}
	}
}

// refreshGossip exchanges state with the join addresses and the alive
// servers, in the background (see Gossip.Refresh).
func (m *Members) refreshGossip() {
	m.wg.Add(1)
	if !m.gossip.Refresh(m.cfg.Join, m.cfg.NodeID, m.wg.Done) {
		m.wg.Done()
	}
}

// tryBootstrap forms a new cluster when exactly BootstrapExpect new servers
// with the same setting see each other (tryBootstrapExpect).
func (m *Members) tryBootstrap(c *Cluster) {
	out, p, err := c.tryBootstrapExpect(m.gossip, m.cfg.BootstrapExpect)
	switch out {
	case bootstrapMismatch:
		m.log.Warn("a new server expects another cluster size; not bootstrapping",
			"server", p.ID, "its_bootstrap_expect", p.Expect, "ours", m.cfg.BootstrapExpect)
	case bootstrapTooMany:
		m.log.Error("more new servers than bootstrap-expect see each other; not bootstrapping",
			"bootstrap_expect", m.cfg.BootstrapExpect)
	case bootstrapFormed:
		if err != nil {
			m.log.Error("bootstrap failed", "err", err)
		}
		m.hadState.Store(true)
		m.gossip.UpdateMeta()
	}
}
