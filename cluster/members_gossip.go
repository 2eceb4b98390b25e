package cluster

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Members' gossip: starting it before Raft (joining), what this server
// announces and exchanges in push/pull (the cluster view, merged from
// peers), and queries over the servers gossip knows.

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
