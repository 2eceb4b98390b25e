package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// Version is this build's version, gossiped to the other servers. The
// command line sets it at start.
var Version = "dev"

// membership is the node's view of the other servers: gossip, the member
// registry it learned at join, and the error that keeps it from serving
// when the cluster refused it.
type membership struct {
	incarnation string
	raftAddr    string // as the others dial it
	gossip      *cluster.Gossip

	mu       sync.Mutex
	remote   *clusterView // last view merged from a server with state
	refused  error        // set when the cluster removed or refused this server
	failedAt map[string]time.Time
	changed  chan struct{}
}

// clusterView is what servers exchange in gossip push/pull: the Raft
// configuration and the member registry as they know them.
type clusterView struct {
	Servers []string           `json:"servers"`
	Members []fsm.MemberRecord `json:"members"`
	Leader  string             `json:"leader,omitempty"`
	// ClusterID is the sender's cluster identity ("" if none yet).
	ClusterID string `json:"cluster_id,omitempty"`
}

func (v *clusterView) member(id string) (fsm.MemberRecord, bool) {
	for _, m := range v.Members {
		if m.ID == id {
			return m, true
		}
	}
	return fsm.MemberRecord{}, false
}

func (v *clusterView) hasServer(id string) bool {
	for _, s := range v.Servers {
		if s == id {
			return true
		}
	}
	return false
}

// loadIncarnation returns the random id of this data directory, creating
// it when missing. A wiped data directory gets a new one, which is how the
// cluster tells a server that lost its state from the one it added.
func loadIncarnation(cfg Config) (string, error) {
	if cfg.InMemory {
		return randomHex(8), nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(cfg.DataDir, "incarnation")
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(b))
		if s != "" && len(s) <= 64 {
			return s, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	inc := randomHex(8)
	if err := writeFileSync(path, inc+"\n"); err != nil {
		return "", err
	}
	return inc, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// advertiseHost resolves cfg.AdvertiseAddr to an IP (empty when unset).
func advertiseHost(cfg Config) (string, error) {
	a := cfg.AdvertiseAddr
	if a == "" {
		return "", nil
	}
	if ip := net.ParseIP(a); ip != nil {
		if ip.IsUnspecified() {
			return "", fmt.Errorf("advertise address %q is unspecified: give an address the other servers can reach", a)
		}
		return ip.String(), nil
	}
	ips, err := net.LookupIP(a)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("advertise address %q does not resolve: %v", a, err)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	return ips[0].String(), nil
}

// withHost replaces the host of a host:port address.
func withHost(addr, host string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return addr
	}
	return net.JoinHostPort(host, port)
}

// startGossip runs between opening the Raft stores and starting Raft: a
// new server that joins an existing cluster first learns, through gossip,
// whether the cluster already knows its id with other data (a wiped data
// directory) or removed it; it then refuses to start instead of rejoining.
func (n *Node) startGossip(hadState bool, addr raft.ServerAddress) error {
	m := n.mem
	m.raftAddr = string(addr)
	host, err := advertiseHost(n.cfg)
	if err != nil {
		return err
	}
	bind := n.cfg.GossipAddr
	if h, _, err := net.SplitHostPort(bind); err == nil && n.cfg.InMemory && !n.cfg.keepGossipPort {
		bind = net.JoinHostPort(h, "0")
	}
	if !hadState && n.cfg.BootstrapExpect <= 1 && len(n.cfg.Join) == 0 {
		// cluster.Open bootstrapped a new cluster just now: a new identity,
		// whatever an earlier cluster-id file said.
		if err := n.idn.set(randomHex(16)); err != nil {
			return err
		}
		n.log.Info("a new cluster identity", "cluster_id", n.idn.get())
		hadState = true
	}
	n.hadState.Store(hadState)
	g, err := cluster.StartGossip(cluster.GossipConfig{
		Name: n.cfg.NodeID, BindAddr: bind, Advertise: host,
		Meta: n.gossipMeta, Stats: n.gossipStats, LocalState: n.gossipState, MergeState: n.mergeState,
		OnChange: n.membershipChanged, Key: n.cfg.GossipKey, Fast: n.cfg.fastGossip, WrapTransport: n.cfg.WrapGossip,
		Logger: n.log,
	})
	if err != nil {
		return err
	}
	m.gossip = g
	if hadState || len(n.cfg.Join) == 0 {
		return nil
	}
	if n.cfg.BootstrapExpect > 1 {
		// Forming a new cluster: the others may not be up yet, so one try
		// here (it catches a wiped server restarted into a running
		// cluster) and the rest in the background.
		if joined, _ := g.Join(n.cfg.Join); joined > 0 {
			if err := n.checkAdmission(); err != nil {
				g.Close()
				return err
			}
		}
		return nil
	}
	// A new server joining a cluster: reach it before Raft can answer
	// anyone.
	deadline := time.Now().Add(n.cfg.JoinTimeout)
	for {
		joined, err := g.Join(n.cfg.Join)
		if joined > 0 {
			break
		}
		if time.Now().After(deadline) {
			g.Close()
			return fmt.Errorf("could not join any of %v within %v: %v", n.cfg.Join, n.cfg.JoinTimeout, err)
		}
		n.log.Info("waiting for other servers to answer gossip", "join", n.cfg.Join, "err", err)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-n.closing:
			g.Close()
			return errClosed
		}
	}
	if err := n.checkAdmission(); err != nil {
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
func (n *Node) checkAdmission() error {
	m := n.mem
	m.mu.Lock()
	v := m.remote
	m.mu.Unlock()
	if v == nil {
		return nil
	}
	id := n.cfg.NodeID
	rec, ok := v.member(id)
	// Without a record the cluster cannot tell (a new cluster formed by
	// bootstrap-expect lists every server before the leader records them).
	if v.hasServer(id) && ok && !rec.Removed && rec.Incarnation != m.incarnation {
		n.log.Warn("the cluster still lists this server with another data directory (wiped or replaced); "+
			"waiting for its leader to remove the old member and add this one as a new server",
			"server", id, "recorded_incarnation", rec.Incarnation, "incarnation", m.incarnation)
		return nil
	}
	if ok && rec.Removed && rec.Incarnation == m.incarnation {
		return fmt.Errorf("server %q was removed from the cluster; to rejoin, wipe its data directory", id)
	}
	return nil
}

func (n *Node) gossipMeta() cluster.Meta {
	expect := 0
	if n.cfg.BootstrapExpect > 1 {
		expect = n.cfg.BootstrapExpect
	}
	return cluster.Meta{ID: n.cfg.NodeID, Raft: n.mem.raftAddr, HTTP: n.cfg.HTTPAddr, Version: Version,
		Incarnation: n.mem.incarnation, Expect: expect, HasState: n.hadState.Load(), ClusterID: n.clusterID(), RaftHello: true, SealCheck: true, ChunkedExpiry: true}
}

func (n *Node) gossipStats() cluster.PeerStats {
	r := n.raftP.Load()
	if r == nil {
		return cluster.PeerStats{State: "starting", LastContactMS: -1}
	}
	st := cluster.PeerStats{State: r.State().String(), LastIndex: r.LastIndex(), LastContactMS: -1}
	st.Term, _ = strconv.ParseUint(r.Stats()["term"], 10, 64)
	if r.State() == raft.Leader {
		st.LastContactMS = 0
	} else if lc := r.LastContact(); !lc.IsZero() {
		st.LastContactMS = time.Since(lc).Milliseconds()
	}
	return st
}

// gossipState is this server's clusterView, sent in push/pull exchanges;
// empty while it has no Raft state.
func (n *Node) gossipState() []byte {
	r := n.raftP.Load()
	if r == nil || !n.hadState.Load() {
		return nil
	}
	v := clusterView{ClusterID: n.clusterID()}
	if fut := r.GetConfiguration(); fut.Error() == nil {
		for _, s := range fut.Configuration().Servers {
			v.Servers = append(v.Servers, string(s.ID))
		}
	}
	_, id := r.LeaderWithID()
	v.Leader = string(id)
	n.rep.mu.RLock()
	v.Members = n.rep.f.Members()
	n.rep.mu.RUnlock()
	b, _ := json.Marshal(v)
	return b
}

func (n *Node) mergeState(buf []byte, _ bool) {
	var v clusterView
	if err := json.Unmarshal(buf, &v); err != nil || len(v.Servers) == 0 {
		return
	}
	m := n.mem
	m.mu.Lock()
	m.remote = &v
	m.mu.Unlock()
	// A server whose id belongs to another cluster than the one in its data
	// directory (it bootstrapped one of its own after a wipe) learns it here.
	_, inRegistry := v.member(n.cfg.NodeID)
	if ours := n.clusterID(); ours != "" && v.ClusterID != "" && ours != v.ClusterID && (inRegistry || v.hasServer(n.cfg.NodeID)) {
		err := n.otherClusterErr(ours, v.ClusterID, &v)
		m.mu.Lock()
		first := m.refused == nil
		m.refused = err
		m.mu.Unlock()
		if first {
			n.log.Error("this server's id belongs to another cluster", "err", err)
		}
		return
	}
	// A server with state learns here that the cluster removed it.
	if rec, ok := v.member(n.cfg.NodeID); ok && rec.Removed && rec.Incarnation == m.incarnation && !v.hasServer(n.cfg.NodeID) {
		err := fmt.Errorf("this server (%s) was removed from the cluster; it does not take part any more. To rejoin, stop it, wipe its data directory and start it again", n.cfg.NodeID)
		m.mu.Lock()
		first := m.refused == nil
		m.refused = err
		m.mu.Unlock()
		if first {
			n.log.Error("removed from the cluster", "err", err)
		}
	}
}

func (n *Node) membershipChanged() {
	select {
	case n.mem.changed <- struct{}{}:
	default:
	}
}

// refusedErr is set when the cluster removed this server, or when its
// sealing key does not match the cluster's (checkSeal).
func (n *Node) refusedErr() error {
	if e := n.sealRefused.Load(); e != nil {
		return *e
	}
	n.mem.mu.Lock()
	defer n.mem.mu.Unlock()
	return n.mem.refused
}

// watchMembership keeps the gossip metadata current (whether this server has
// Raft state) and, for a new server started with BootstrapExpect > 1, forms
// the cluster once enough servers see each other.
func (n *Node) watchMembership() {
	defer n.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	// A server with Raft state (restarted) joins too: the others may all
	// have restarted as well, or have given it up as failed long ago, and
	// without gossip it knows no peer's HTTP address (nothing is forwarded)
	// and never learns that it was removed.
	joined := len(n.cfg.Join) == 0
	var lastJoin, lastRefresh time.Time
	for {
		select {
		case <-n.closing:
			return
		case <-t.C:
		case <-n.mem.changed:
		}
		if !n.hadState.Load() && n.cl.Raft.LastIndex() > 0 {
			n.hadState.Store(true)
			n.mem.gossip.UpdateMeta()
		}
		n.syncClusterID()
		n.checkSeal()
		// A server without state that refused Raft traffic (admitRaft), and
		// one whose Raft peer turned out to be of another cluster, exchange
		// gossip state with every server every second while it lasts (gossip
		// may still hold a restarted server's old metadata, and it must
		// learn that its id belongs to this cluster); every server reaches
		// out every 5 s to the join addresses while a server of its
		// configuration is not alive in gossip (a server that restarted
		// without --join finds nobody by itself).
		gated := !n.hadState.Load() && time.Since(time.Unix(0, n.gated.Load())) < 3*time.Second
		conflict := time.Since(time.Unix(0, n.conflictAt.Load())) < 3*time.Second
		if (gated || conflict) && time.Since(lastRefresh) > time.Second || time.Since(lastRefresh) > 5*time.Second && n.missingServer() {
			lastRefresh = time.Now()
			n.refreshGossip()
		}
		// Join at start, and again (every 2 s) whenever gossip sees no
		// other server: after a partition longer than gossip remembers
		// failed servers, nobody would contact anybody otherwise.
		if len(n.cfg.Join) > 0 && (!joined || n.mem.gossip.Alive() <= 1 && time.Since(lastJoin) > 2*time.Second) {
			lastJoin = time.Now()
			if k, _ := n.mem.gossip.Join(n.cfg.Join); k > 0 {
				joined = true
			}
		}
		if !n.hadState.Load() && n.cfg.BootstrapExpect > 1 {
			n.tryBootstrap()
		}
	}
}

// missingServer: a server of the Raft configuration is not alive in gossip.
func (n *Node) missingServer() bool {
	fut := n.cl.Raft.GetConfiguration()
	if fut.Error() != nil {
		return false
	}
	alive := map[string]bool{}
	for _, p := range n.mem.gossip.Peers() {
		if p.Status == "alive" {
			alive[p.ID] = true
		}
	}
	for _, s := range fut.Configuration().Servers {
		if string(s.ID) != n.cfg.NodeID && !alive[string(s.ID)] {
			return true
		}
	}
	return false
}

// refreshGossip exchanges state with the join addresses and the alive
// servers, in the background (one exchange at a time; a paused peer can
// hold one for gossip's TCP timeout).
func (n *Node) refreshGossip() {
	if !n.refreshing.CompareAndSwap(false, true) {
		return
	}
	addrs := append([]string(nil), n.cfg.Join...)
	for _, p := range n.mem.gossip.Peers() {
		if p.Status == "alive" && p.ID != n.cfg.NodeID && p.Addr != "" {
			addrs = append(addrs, p.Addr)
		}
	}
	if len(addrs) == 0 {
		n.refreshing.Store(false)
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.refreshing.Store(false)
		n.mem.gossip.Join(addrs)
	}()
}

// tryBootstrap forms a new cluster when exactly BootstrapExpect new servers
// with the same setting see each other. Each of them computes the same
// configuration (every one of them, sorted by id) and bootstraps it.
func (n *Node) tryBootstrap() {
	var servers []raft.Server
	for _, p := range n.mem.gossip.Peers() {
		if p.Status != "alive" {
			continue
		}
		if p.HasState {
			// An existing cluster: its leader adds this server.
			return
		}
		if p.Expect != n.cfg.BootstrapExpect {
			n.log.Warn("a new server expects another cluster size; not bootstrapping",
				"server", p.ID, "its_bootstrap_expect", p.Expect, "ours", n.cfg.BootstrapExpect)
			return
		}
		if p.Raft == "" {
			return
		}
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Raft)})
	}
	if len(servers) != n.cfg.BootstrapExpect {
		if len(servers) > n.cfg.BootstrapExpect {
			n.log.Error("more new servers than bootstrap-expect see each other; not bootstrapping",
				"seen", len(servers), "bootstrap_expect", n.cfg.BootstrapExpect)
		}
		return
	}
	sort.Slice(servers, func(i, j int) bool { return servers[i].ID < servers[j].ID })
	if err := n.cl.BootstrapWith(servers); err != nil {
		if !errors.Is(err, raft.ErrCantBootstrap) {
			n.log.Error("bootstrap failed", "err", err)
		}
	}
	n.hadState.Store(true)
	n.mem.gossip.UpdateMeta()
}

// LeaderInfo names the current leader as this node knows it.
type LeaderInfo struct {
	ID       string `json:"id"`
	HTTPAddr string `json:"http_addr"`
	// RaftAddr is the leader's Raft address, where its node-to-node
	// streams are served (DialPeer).
	RaftAddr string `json:"-"`
	// Self: this node is the leader.
	Self bool `json:"self"`
}

// Leader returns the leader this node knows of; ok is false when none is
// known (or its HTTP address is not known yet). An application embedding a
// follower uses it to send writes to the leader.
func (n *Node) Leader() (LeaderInfo, bool) {
	addr, id := n.cl.Raft.LeaderWithID()
	if id == "" {
		return LeaderInfo{}, false
	}
	if string(id) == n.cfg.NodeID {
		return LeaderInfo{ID: string(id), HTTPAddr: n.cfg.HTTPAddr, RaftAddr: string(addr), Self: n.cl.Raft.State() == raft.Leader}, true
	}
	p, ok := n.mem.gossip.Peer(string(id))
	if !ok || p.HTTP == "" {
		return LeaderInfo{ID: string(id), RaftAddr: string(addr)}, false
	}
	return LeaderInfo{ID: string(id), HTTPAddr: p.HTTP, RaftAddr: string(addr)}, true
}

// proposeMember records a server in the replicated member registry.
func (n *Node) proposeMember(ctx context.Context, m *fsm.Member) error {
	_, _, err := n.propose(ctx, m)
	return err
}

// NodeID is this node's id.
func (n *Node) NodeID() string { return n.cfg.NodeID }
