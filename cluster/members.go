package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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

// clusterView is what servers exchange in gossip push/pull: the Raft
// configuration and the member registry as they know them.
type clusterView struct {
	Servers []string     `json:"servers"`
	Members []viewMember `json:"members"`
	Leader  string       `json:"leader,omitempty"`
	// ClusterID is the sender's cluster identity ("" if none yet).
	ClusterID string `json:"cluster_id,omitempty"`
}

// viewMember is a registry record in a clusterView (the field names are
// the wire's).
type viewMember struct {
	ID          string
	Incarnation string
	Removed     bool
	Index       uint64
}

func (v *clusterView) member(id string) (viewMember, bool) {
	for _, m := range v.Members {
		if m.ID == id {
			return m, true
		}
	}
	return viewMember{}, false
}

func (v *clusterView) hasServer(id string) bool {
	for _, s := range v.Servers {
		if s == id {
			return true
		}
	}
	return false
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

// Refused is set when the cluster removed this server, or when gossip
// shows its id belongs to another cluster than its data directory's.
func (m *Members) Refused() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

// identity is the cluster id exchange's view of this server.
func (m *Members) identity() *Identity {
	return &Identity{ClusterID: m.ClusterID, Admit: m.admitRaft,
		OnConflict: func(string, string) { m.conflictAt.Store(time.Now().UnixNano()) }, Legacy: m.legacyPeer}
}

// startGossip runs between opening the Raft stores and starting Raft: a
// new server that joins an existing cluster first learns, through gossip,
// whether the cluster already knows its id with other data (a wiped data
// directory) or removed it; it then refuses to start instead of rejoining.
func (m *Members) startGossip(hadState bool, addr string) error {
	cfg := m.cfg
	m.raftAddr = addr
	if !hadState && cfg.BootstrapExpect <= 1 && len(cfg.Join) == 0 {
		// Open bootstrapped a new cluster just now: a new identity,
		// whatever an earlier cluster-id file said.
		if err := m.local.Set(NewClusterID()); err != nil {
			return err
		}
		m.log.Info("a new cluster identity", "cluster_id", m.local.Get())
		hadState = true
	}
	m.hadState.Store(hadState)
	g, err := StartGossip(GossipConfig{
		Name: cfg.NodeID, BindAddr: cfg.GossipAddr, Advertise: cfg.Advertise,
		Meta: m.meta, Stats: m.Stats, LocalState: m.localState, MergeState: m.mergeState,
		OnChange: m.membershipChanged, Key: cfg.GossipKey, Fast: cfg.FastGossip, WrapTransport: cfg.WrapGossip,
		Logger: m.log,
	})
	if err != nil {
		return err
	}
	m.gossip = g
	if hadState || len(cfg.Join) == 0 {
		return nil
	}
	if cfg.BootstrapExpect > 1 {
		// Forming a new cluster: the others may not be up yet, so one try
		// here (it catches a wiped server restarted into a running
		// cluster) and the rest in the background.
		if joined, _ := g.Join(cfg.Join); joined > 0 {
			if err := m.checkAdmission(); err != nil {
				g.Close()
				return err
			}
		}
		return nil
	}
	// A new server joining a cluster: reach it before Raft can answer
	// anyone.
	if err := g.JoinWithin(cfg.Join, cfg.JoinTimeout, cfg.Stop); err != nil {
		g.Close()
		return err
	}
	if err := m.checkAdmission(); err != nil {
		g.Close()
		return err
	}
	return nil
}

// checkAdmission refuses a new server whose data directory the cluster
// removed. One whose id the cluster still lists with another data directory
// (wiped or replaced) starts, but takes no Raft traffic (admitRaft) until
// the leader, seeing the new data directory in gossip, has removed the old
// member and added this one as a new server.
func (m *Members) checkAdmission() error {
	m.mu.Lock()
	v := m.remote
	m.mu.Unlock()
	if v == nil {
		return nil
	}
	id := m.cfg.NodeID
	rec, ok := v.member(id)
	// Without a record the cluster cannot tell (a new cluster formed by
	// bootstrap-expect lists every server before the leader records them).
	if v.hasServer(id) && ok && !rec.Removed && rec.Incarnation != m.incarnation {
		m.log.Warn("the cluster still lists this server with another data directory (wiped or replaced); "+
			"waiting for its leader to remove the old member and add this one as a new server",
			"server", id, "recorded_incarnation", rec.Incarnation, "incarnation", m.incarnation)
		return nil
	}
	if ok && rec.Removed && rec.Incarnation == m.incarnation {
		return fmt.Errorf("server %q was removed from the cluster; to rejoin, wipe its data directory", id)
	}
	return nil
}

// admitRaft decides whether a Raft connection may reach this server while it
// has no Raft state (a new or wiped server): from a cluster with an
// identity, only once gossip brought the cluster's view and that view does
// not list this server's id with another data directory. Otherwise an
// empty log, still a voter in the cluster's configuration under the old id,
// could vote a candidate that lacks committed entries into leadership. A
// peer without identity is a cluster being formed by bootstrap-expect (the
// first server to bootstrap asks the others for votes before they have
// bootstrapped themselves) or one from before identities: admitted.
func (m *Members) admitRaft(peerCluster string) error {
	if m.hadState.Load() {
		return nil
	}
	m.mu.Lock()
	v := m.remote
	m.mu.Unlock()
	id := m.cfg.NodeID
	var err error
	switch {
	case v == nil && peerCluster == "":
	case v == nil:
		err = errors.New("this server has no Raft state and has not heard from the cluster through gossip yet")
	case v.ClusterID != "" && peerCluster != "" && v.ClusterID != peerCluster:
		err = fmt.Errorf("gossip names cluster %s, the peer is of cluster %s", v.ClusterID, peerCluster)
	default:
		if rec, ok := v.member(id); ok && v.hasServer(id) && !rec.Removed && rec.Incarnation != m.incarnation {
			err = fmt.Errorf("the cluster still lists %s as a voter with another data directory (%s, this one %s): "+
				"waiting for its leader to replace the old member", id, rec.Incarnation, m.incarnation)
		}
	}
	if err != nil {
		m.gated.Store(time.Now().UnixNano())
	}
	return err
}

// legacyPeer: gossip shows the server at Raft address addr runs a version
// whose Raft connections do not start with the cluster id exchange.
func (m *Members) legacyPeer(addr string) bool {
	g := m.gossip
	if g == nil {
		return false
	}
	for _, p := range g.Peers() {
		if p.Raft == addr && p.Version != "" {
			return !p.RaftHello
		}
	}
	return false
}

// ClusterID is the id this server goes by: the replicated one once
// applied, else the one in its data directory; "" when it has none.
func (m *Members) ClusterID() string {
	if m.cfg.IDs != nil {
		if id := m.cfg.IDs.ClusterID(); id != "" {
			return id
		}
	}
	return m.local.Get()
}

// syncClusterID keeps the data directory's id equal to the replicated one.
func (m *Members) syncClusterID() {
	if m.cfg.IDs == nil {
		return
	}
	id := m.cfg.IDs.ClusterID()
	if id == "" || id == m.local.Get() {
		return
	}
	if old := m.local.Get(); old != "" {
		m.log.Warn("the replicated cluster id differs from the data directory's; taking the replicated one", "cluster_id", id, "was", old)
	}
	if err := m.local.Set(id); err != nil {
		m.log.Error("recording the cluster id", "err", err)
		return
	}
	m.gossip.UpdateMeta()
}

// RecordClusterID runs on the leader (each reconcile pass, with the ids of
// the configuration): a state without an id (a new cluster, or one from
// before identities) gets this server's, or a new one; but only once
// gossip shows every server of the configuration runs a version that knows
// the ClusterID entry (an earlier version stops on an entry type it does
// not know: a rolling upgrade records the id once it is complete).
func (m *Members) RecordClusterID(ctx context.Context, ids []string) {
	if m.cfg.IDs == nil || m.cfg.IDs.ClusterID() != "" {
		return
	}
	for _, id := range ids {
		if id == m.cfg.NodeID {
			continue
		}
		if p, ok := m.gossip.Peer(id); !ok || !p.RaftHello {
			return
		}
	}
	id := m.local.Get()
	if id == "" {
		id = NewClusterID()
	}
	if err := m.cfg.IDs.ProposeClusterID(ctx, id); err != nil {
		if ctx.Err() == nil {
			m.log.Warn("leadership: recording the cluster id failed", "err", err)
		}
		return
	}
	m.log.Info("recorded the cluster id", "cluster_id", id)
	m.syncClusterID()
}

// otherClusterErr says what the operator must do when gossip shows that this
// server's id belongs to cluster theirs while this data directory holds
// cluster ours.
func (m *Members) otherClusterErr(ours, theirs string, v *clusterView) error {
	return fmt.Errorf("this server (%s) holds cluster %s, but cluster %s (servers %s) knows its id: "+
		"its data directory was wiped or replaced and it formed a new cluster on its own at start. "+
		"It exchanges no Raft traffic with cluster %s and serves nothing. Stop it, wipe its data directory "+
		"and start it with --join naming a server of cluster %s (the leader replaces the old member); "+
		"do not start a wiped server without --join",
		m.cfg.NodeID, ours, theirs, strings.Join(v.Servers, ","), theirs, theirs)
}

// meta is what this server announces in gossip.
func (m *Members) meta() Meta {
	var meta Meta
	if m.cfg.Meta != nil {
		meta = m.cfg.Meta()
	}
	expect := 0
	if m.cfg.BootstrapExpect > 1 {
		expect = m.cfg.BootstrapExpect
	}
	meta.ID, meta.Raft, meta.Incarnation, meta.Expect = m.cfg.NodeID, m.raftAddr, m.incarnation, expect
	meta.HasState, meta.ClusterID, meta.RaftHello = m.hadState.Load(), m.ClusterID(), true
	return meta
}

// Stats is this server's Raft view (and its resources) as ping acks carry
// it.
func (m *Members) Stats() PeerStats {
	c := m.c.Load()
	if c == nil {
		return PeerStats{State: "starting", LastContactMS: -1}
	}
	var st PeerStats
	if m.cfg.Resources != nil {
		st = m.cfg.Resources()
	}
	st.State, st.LastIndex, st.LastContactMS = string(c.State()), c.LastIndex(), -1
	st.Term, _ = strconv.ParseUint(c.Stats()["term"], 10, 64)
	if c.IsLeader() {
		st.LastContactMS = 0
	} else if lc := c.LastContact(); !lc.IsZero() {
		st.LastContactMS = time.Since(lc).Milliseconds()
	}
	return st
}

// localState is this server's clusterView, sent in push/pull exchanges;
// empty while it has no Raft state.
func (m *Members) localState() []byte {
	c := m.c.Load()
	if c == nil || !m.hadState.Load() {
		return nil
	}
	v := clusterView{ClusterID: m.ClusterID()}
	if conf, err := c.Configuration(); err == nil {
		for _, s := range conf.Servers {
			v.Servers = append(v.Servers, s.ID)
		}
	}
	_, v.Leader = c.Leader()
	if m.cfg.Registry != nil {
		for _, r := range m.cfg.Registry.Members() {
			v.Members = append(v.Members, viewMember{ID: r.ID, Incarnation: r.Incarnation, Removed: r.Removed, Index: r.Index})
		}
	}
	b, _ := json.Marshal(v)
	return b
}

func (m *Members) mergeState(buf []byte, _ bool) {
	var v clusterView
	if err := json.Unmarshal(buf, &v); err != nil || len(v.Servers) == 0 {
		return
	}
	m.mu.Lock()
	m.remote = &v
	m.mu.Unlock()
	self := m.cfg.NodeID
	// A server whose id belongs to another cluster than the one in its data
	// directory (it bootstrapped one of its own after a wipe) learns it here.
	_, inRegistry := v.member(self)
	if ours := m.ClusterID(); ours != "" && v.ClusterID != "" && ours != v.ClusterID && (inRegistry || v.hasServer(self)) {
		err := m.otherClusterErr(ours, v.ClusterID, &v)
		if m.refuse(err) {
			m.log.Error("this server's id belongs to another cluster", "err", err)
		}
		return
	}
	// A server with state learns here that the cluster removed it.
	if rec, ok := v.member(self); ok && rec.Removed && rec.Incarnation == m.incarnation && !v.hasServer(self) {
		err := fmt.Errorf("this server (%s) was removed from the cluster; it does not take part any more. To rejoin, stop it, wipe its data directory and start it again", self)
		if m.refuse(err) {
			m.log.Error("removed from the cluster", "err", err)
		}
	}
}

// refuse records why the cluster refuses this server; it reports whether
// it is the first reason.
func (m *Members) refuse(err error) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := m.refused == nil
	m.refused = err
	return first
}

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
		// A server without state that refused Raft traffic (admitRaft), and
		// one whose Raft peer turned out to be of another cluster, exchange
		// gossip state with every server every second while it lasts (gossip
		// may still hold a restarted server's old metadata, and it must
		// learn that its id belongs to this cluster); every server reaches
		// out every 5 s to the join addresses while a server of its
		// configuration is not alive in gossip (a server that restarted
		// without --join finds nobody by itself). A server that restarted
		// at another address does it every second until its leader lists
		// it at the new one: gossip takes its new address only once the
		// old one is declared dead, and only from an exchange after that.
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

// EveryServer reports whether every server of ids but this one announces
// has in gossip (a server gossip does not know does not).
func (m *Members) EveryServer(ids []string, has func(Peer) bool) bool {
	return EveryPeer(m.cfg.NodeID, ids, m.gossip.Peer, has)
}

// EveryPeer reports whether every server of ids but self is known through
// peer and has has.
func EveryPeer(self string, ids []string, peer func(string) (Peer, bool), has func(Peer) bool) bool {
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
