package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// membership is the node's view of the other servers: gossip, the member
// registry it learned at join, and the error that keeps it from serving
// when the cluster refused it.
type membership struct {
	n           *Node
	incarnation string
	raftAddr    string // as the others dial it
	gossip      *cluster.Gossip

	mu      sync.Mutex
	remote  *clusterView // last view merged from a server with state
	refused error        // set when the cluster removed or refused this server
	changed chan struct{}
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
func (mb *membership) startGossip(hadState bool, addr raft.ServerAddress) error {
	m := mb.n.mem
	m.raftAddr = string(addr)
	host, err := advertiseHost(mb.n.cfg)
	if err != nil {
		return err
	}
	bind := mb.n.cfg.GossipAddr
	if h, _, err := net.SplitHostPort(bind); err == nil && mb.n.cfg.InMemory && !mb.n.cfg.keepGossipPort {
		bind = net.JoinHostPort(h, "0")
	}
	if !hadState && mb.n.cfg.BootstrapExpect <= 1 && len(mb.n.cfg.Join) == 0 {
		// cluster.Open bootstrapped a new cluster just now: a new identity,
		// whatever an earlier cluster-id file said.
		if err := mb.n.idn.set(cluster.NewClusterID()); err != nil {
			return err
		}
		mb.n.log.Info("a new cluster identity", "cluster_id", mb.n.idn.get())
		hadState = true
	}
	mb.n.hadState.Store(hadState)
	g, err := cluster.StartGossip(cluster.GossipConfig{
		Name: mb.n.cfg.NodeID, BindAddr: bind, Advertise: host,
		Meta: mb.gossipMeta, Stats: mb.gossipStats, LocalState: mb.gossipState, MergeState: mb.mergeState,
		OnChange: mb.membershipChanged, Key: mb.n.cfg.GossipKey, Fast: mb.n.cfg.FastGossip, WrapTransport: mb.n.cfg.WrapGossip,
		Logger: mb.n.log,
	})
	if err != nil {
		return err
	}
	m.gossip = g
	if hadState || len(mb.n.cfg.Join) == 0 {
		return nil
	}
	if mb.n.cfg.BootstrapExpect > 1 {
		// Forming a new cluster: the others may not be up yet, so one try
		// here (it catches a wiped server restarted into a running
		// cluster) and the rest in the background.
		if joined, _ := g.Join(mb.n.cfg.Join); joined > 0 {
			if err := mb.checkAdmission(); err != nil {
				g.Close()
				return err
			}
		}
		return nil
	}
	// A new server joining a cluster: reach it before Raft can answer
	// anyone.
	if err := g.JoinWithin(mb.n.cfg.Join, mb.n.cfg.JoinTimeout, mb.n.closing); err != nil {
		g.Close()
		if errors.Is(err, cluster.ErrGossipClosed) {
			return errClosed
		}
		return err
	}
	if err := mb.checkAdmission(); err != nil {
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
func (mb *membership) checkAdmission() error {
	m := mb.n.mem
	m.mu.Lock()
	v := m.remote
	m.mu.Unlock()
	if v == nil {
		return nil
	}
	id := mb.n.cfg.NodeID
	rec, ok := v.member(id)
	// Without a record the cluster cannot tell (a new cluster formed by
	// bootstrap-expect lists every server before the leader records them).
	if v.hasServer(id) && ok && !rec.Removed && rec.Incarnation != m.incarnation {
		mb.n.log.Warn("the cluster still lists this server with another data directory (wiped or replaced); "+
			"waiting for its leader to remove the old member and add this one as a new server",
			"server", id, "recorded_incarnation", rec.Incarnation, "incarnation", m.incarnation)
		return nil
	}
	if ok && rec.Removed && rec.Incarnation == m.incarnation {
		return fmt.Errorf("server %q was removed from the cluster; to rejoin, wipe its data directory", id)
	}
	return nil
}

func (mb *membership) gossipMeta() cluster.Meta {
	expect := 0
	if mb.n.cfg.BootstrapExpect > 1 {
		expect = mb.n.cfg.BootstrapExpect
	}
	return cluster.Meta{ID: mb.n.cfg.NodeID, Raft: mb.raftAddr, HTTP: mb.n.cfg.HTTPAddr, Version: mb.n.cfg.version(),
		Incarnation: mb.incarnation, Expect: expect, HasState: mb.n.hadState.Load(), ClusterID: mb.n.idn.clusterID(), RaftHello: true, SealCheck: true, ChunkedExpiry: true, RestoreLog: true, EntryCRC: true, Features: true,
		RenewMeta: true, GrantKey: mb.n.gk.pubB64, LeaseGroups: true, SessionMeta: true, RestoreBounds: true}
}

func (mb *membership) gossipStats() cluster.PeerStats {
	r := mb.n.clP.Load()
	if r == nil {
		return cluster.PeerStats{State: "starting", LastContactMS: -1}
	}
	st := cluster.PeerStats{State: r.State().String(), LastIndex: r.LastIndex(), LastContactMS: -1,
		DiskLow: mb.n.disk.low.Load(), DiskFree: max(mb.n.disk.free.Load(), 0), MemLimit: mb.n.bk.memLimit()}
	st.Term, _ = strconv.ParseUint(r.Stats()["term"], 10, 64)
	if r.IsLeader() {
		st.LastContactMS = 0
	} else if lc := r.LastContact(); !lc.IsZero() {
		st.LastContactMS = time.Since(lc).Milliseconds()
	}
	return st
}

// gossipState is this server's clusterView, sent in push/pull exchanges;
// empty while it has no Raft state.
func (mb *membership) gossipState() []byte {
	r := mb.n.clP.Load()
	if r == nil || !mb.n.hadState.Load() {
		return nil
	}
	v := clusterView{ClusterID: mb.n.idn.clusterID()}
	if conf, err := r.Configuration(); err == nil {
		for _, s := range conf.Servers {
			v.Servers = append(v.Servers, string(s.ID))
		}
	}
	_, id := r.Leader()
	v.Leader = string(id)
	mb.n.rep.mu.RLock()
	v.Members = mb.n.rep.f.Members()
	mb.n.rep.mu.RUnlock()
	b, _ := json.Marshal(v)
	return b
}

func (mb *membership) mergeState(buf []byte, _ bool) {
	var v clusterView
	if err := json.Unmarshal(buf, &v); err != nil || len(v.Servers) == 0 {
		return
	}
	m := mb.n.mem
	m.mu.Lock()
	m.remote = &v
	m.mu.Unlock()
	// A server whose id belongs to another cluster than the one in its data
	// directory (it bootstrapped one of its own after a wipe) learns it here.
	_, inRegistry := v.member(mb.n.cfg.NodeID)
	if ours := mb.n.idn.clusterID(); ours != "" && v.ClusterID != "" && ours != v.ClusterID && (inRegistry || v.hasServer(mb.n.cfg.NodeID)) {
		err := mb.n.idn.otherClusterErr(ours, v.ClusterID, &v)
		m.mu.Lock()
		first := m.refused == nil
		m.refused = err
		m.mu.Unlock()
		if first {
			mb.n.log.Error("this server's id belongs to another cluster", "err", err)
		}
		return
	}
	// A server with state learns here that the cluster removed it.
	if rec, ok := v.member(mb.n.cfg.NodeID); ok && rec.Removed && rec.Incarnation == m.incarnation && !v.hasServer(mb.n.cfg.NodeID) {
		err := fmt.Errorf("this server (%s) was removed from the cluster; it does not take part any more. To rejoin, stop it, wipe its data directory and start it again", mb.n.cfg.NodeID)
		m.mu.Lock()
		first := m.refused == nil
		m.refused = err
		m.mu.Unlock()
		if first {
			mb.n.log.Error("removed from the cluster", "err", err)
		}
	}
}

func (mb *membership) membershipChanged() {
	select {
	case mb.changed <- struct{}{}:
	default:
	}
}

// refusedErr is set when the cluster removed this server, or when its
// sealing key does not match the cluster's (checkSeal).
func (mb *membership) refusedErr() error {
	if e := mb.n.sg.sealRefused.Load(); e != nil {
		return *e
	}
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return mb.refused
}

// watchMembership keeps the gossip metadata current (whether this server has
// Raft state) and, for a new server started with BootstrapExpect > 1, forms
// the cluster once enough servers see each other.
func (mb *membership) watchMembership() {
	defer mb.n.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	// A server with Raft state (restarted) joins too: the others may all
	// have restarted as well, or have given it up as failed long ago, and
	// without gossip it knows no peer's HTTP address (nothing is forwarded)
	// and never learns that it was removed.
	joined := len(mb.n.cfg.Join) == 0
	var lastJoin, lastRefresh time.Time
	for {
		select {
		case <-mb.n.closing:
			return
		case <-t.C:
		case <-mb.changed:
		}
		if !mb.n.hadState.Load() && mb.n.cl.LastIndex() > 0 {
			mb.n.hadState.Store(true)
			mb.gossip.UpdateMeta()
		}
		mb.n.idn.syncClusterID()
		mb.n.sg.checkSeal()
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
		gated := !mb.n.hadState.Load() && time.Since(time.Unix(0, mb.n.gated.Load())) < 3*time.Second
		conflict := time.Since(time.Unix(0, mb.n.conflictAt.Load())) < 3*time.Second
		if (gated || conflict || mb.n.cl.Moved()) && time.Since(lastRefresh) > time.Second || time.Since(lastRefresh) > 5*time.Second && mb.n.cl.MissingServer(mb.gossip) {
			lastRefresh = time.Now()
			mb.refreshGossip()
		}
		// Join at start, and again (every 2 s) whenever gossip sees no
		// other server: after a partition longer than gossip remembers
		// failed servers, nobody would contact anybody otherwise.
		if len(mb.n.cfg.Join) > 0 && (!joined || mb.gossip.Alive() <= 1 && time.Since(lastJoin) > 2*time.Second) {
			lastJoin = time.Now()
			if k, _ := mb.gossip.Join(mb.n.cfg.Join); k > 0 {
				joined = true
			}
		}
		if !mb.n.hadState.Load() && mb.n.cfg.BootstrapExpect > 1 {
			mb.tryBootstrap()
		}
	}
}

// refreshGossip exchanges state with the join addresses and the alive
// servers, in the background (see cluster.Gossip.Refresh).
func (mb *membership) refreshGossip() {
	mb.n.wg.Add(1)
	if !mb.gossip.Refresh(mb.n.cfg.Join, mb.n.cfg.NodeID, mb.n.wg.Done) {
		mb.n.wg.Done()
	}
}

// tryBootstrap forms a new cluster when exactly BootstrapExpect new servers
// with the same setting see each other (cluster.TryBootstrapExpect).
func (mb *membership) tryBootstrap() {
	out, p, err := mb.n.cl.TryBootstrapExpect(mb.gossip, mb.n.cfg.BootstrapExpect)
	switch out {
	case cluster.BootstrapMismatch:
		mb.n.log.Warn("a new server expects another cluster size; not bootstrapping",
			"server", p.ID, "its_bootstrap_expect", p.Expect, "ours", mb.n.cfg.BootstrapExpect)
	case cluster.BootstrapTooMany:
		mb.n.log.Error("more new servers than bootstrap-expect see each other; not bootstrapping",
			"bootstrap_expect", mb.n.cfg.BootstrapExpect)
	case cluster.BootstrapFormed:
		if err != nil {
			mb.n.log.Error("bootstrap failed", "err", err)
		}
		mb.n.hadState.Store(true)
		mb.gossip.UpdateMeta()
	}
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
	addr, id := n.cl.Leader()
	if id == "" {
		return LeaderInfo{}, false
	}
	if string(id) == n.cfg.NodeID {
		return LeaderInfo{ID: string(id), HTTPAddr: n.cfg.HTTPAddr, RaftAddr: string(addr), Self: n.cl.IsLeader()}, true
	}
	p, ok := n.mem.gossip.Peer(string(id))
	if !ok || p.HTTP == "" {
		return LeaderInfo{ID: string(id), RaftAddr: string(addr)}, false
	}
	return LeaderInfo{ID: string(id), HTTPAddr: p.HTTP, RaftAddr: string(addr)}, true
}

// NodeID is this node's id.
func (n *Node) NodeID() string { return n.cfg.NodeID }
