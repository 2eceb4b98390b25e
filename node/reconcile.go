package node

import (
	"context"
	"sort"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// The leader reconciles gossip membership with the Raft configuration:
// a new server (one whose data directory the registry does not know as
// removed) is added as a non-voter and autopilot promotes it to voter once
// it has been healthy for StabilizationTime. Failed servers are only
// reported, unless DeadServerTimeout is set; then autopilot removes them,
// never below MinQuorum voters and never a majority at once. Removing a
// server never touches a lease.

// reconcileLoop runs on the leader for one term.
func (n *Node) reconcileLoop(ctx context.Context) {
	ap := autopilot.New(n.cl.Raft, (*pilot)(n),
		autopilot.WithLogger(cluster.HCLogger("autopilot", n.log)),
		autopilot.WithReconcileInterval(time.Second),
		autopilot.WithUpdateInterval(500*time.Millisecond))
	n.pilot.Store(ap)
	ap.Start(ctx)
	defer func() {
		<-ap.Stop()
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		n.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.mem.changed:
		}
	}
}

// reconcile does one pass: record the data directory of every server in the
// configuration, and add alive servers that are not in it.
func (n *Node) reconcile(ctx context.Context) {
	r := n.cl.Raft
	fut := r.GetConfiguration()
	if fut.Error() != nil {
		return
	}
	n.recordClusterID(ctx, fut.Configuration())
	ids := make([]string, 0, len(fut.Configuration().Servers))
	for _, s := range fut.Configuration().Servers {
		ids = append(ids, string(s.ID))
	}
	n.recordSealCheck(ctx, ids)
	n.updateChunkedExpiry(ids)
	inConf := map[string]bool{}
	for _, s := range fut.Configuration().Servers {
		inConf[string(s.ID)] = true
	}
	for _, p := range n.mem.gossip.Peers() {
		rec, known := n.memberRecord(p.ID)
		switch {
		case inConf[p.ID]:
			// Record the data directory the server runs with, once.
			if p.Status == "alive" && p.Incarnation != "" && !known {
				n.proposeMember(ctx, &fsm.Member{ID: p.ID, Incarnation: p.Incarnation})
			}
			// A member that came back with another data directory (wiped or
			// replaced) has lost its log: it must neither vote nor count
			// toward a quorum. Remove the old member (a tombstone of the
			// old data directory); the new one is added back as a new server
			// below if it may be.
			if p.Status == "alive" && p.Incarnation != "" && known && !rec.Removed &&
				rec.Incarnation != p.Incarnation && p.ID != n.cfg.NodeID {
				n.replaceWiped(ctx, p, rec)
			}
		case p.Status != "alive" || p.Raft == "" || p.Incarnation == "":
		case known && rec.Removed && rec.Incarnation == p.Incarnation:
			// Removed: it stays out until its data directory is wiped.
		case p.ClusterID != "" && p.ClusterID != n.clusterID() && n.clusterID() != "":
			n.log.Warn("a server of another cluster is in gossip; Raft traffic with it is refused",
				"server", p.ID, "its_cluster", p.ClusterID, "cluster", n.clusterID(), "raft_addr", p.Raft)
		case !p.HasState || known && rec.Incarnation == p.Incarnation || p.ClusterID != "" && p.ClusterID == n.clusterID():
			// A new server (or one added before whose join did not finish).
			if err := n.proposeMember(ctx, &fsm.Member{ID: p.ID, Incarnation: p.Incarnation}); err != nil {
				continue
			}
			n.log.Info("adding a new server as non-voter", "server", p.ID, "raft_addr", p.Raft)
			if err := r.AddNonvoter(raft.ServerID(p.ID), raft.ServerAddress(p.Raft), 0, n.cfg.ApplyTimeout).Error(); err != nil {
				n.log.Warn("adding a server failed", "server", p.ID, "err", err)
			}
		default:
			// Raft state of another cluster, or of one this cluster no longer
			// knows: never merged silently.
			n.log.Warn("a server with Raft state that is not a member tries to join; ignoring it",
				"server", p.ID, "raft_addr", p.Raft)
		}
	}
}

// replaceWiped removes server p, whose data directory is not the one the
// registry recorded (rec): the old data directory is tombstoned, so the new
// one can join as a new server.
func (n *Node) replaceWiped(ctx context.Context, p cluster.Peer, rec fsm.MemberRecord) {
	n.log.Warn("a member came back with another data directory (wiped or replaced); removing the old member",
		"server", p.ID, "recorded_incarnation", rec.Incarnation, "incarnation", p.Incarnation, "its_cluster", p.ClusterID)
	if res, _, err := n.propose(ctx, &fsm.Member{ID: p.ID, Incarnation: rec.Incarnation, Removed: true}); err != nil || res.Err != nil {
		n.log.Warn("removing a wiped member: recording failed", "server", p.ID, "err", err)
		return
	}
	if err := n.cl.Raft.RemoveServer(raft.ServerID(p.ID), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		n.log.Warn("removing a wiped member failed", "server", p.ID, "err", err)
		return
	}
	n.log.Info("removed the old member of a wiped server", "server", p.ID)
}

func (n *Node) memberRecord(id string) (fsm.MemberRecord, bool) {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Member(id)
}

// pilot is the node as autopilot's application integration.
type pilot Node

func (p *pilot) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      p.cfg.DeadServerTimeout > 0,
		LastContactThreshold:    2 * time.Second,
		MaxTrailingLogs:         4096,
		MinQuorum:               uint(p.cfg.MinQuorum),
		ServerStabilizationTime: p.cfg.StabilizationTime,
	}
}

func (p *pilot) NotifyState(s *autopilot.State) { p.apState.Store(s) }

// FetchServerStats answers from the Raft views servers attach to gossip
// ping acks (at most a few seconds old) and this server's own.
func (p *pilot) FetchServerStats(_ context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	n := (*Node)(p)
	out := make(map[raft.ServerID]*autopilot.ServerStats, len(servers))
	for id := range servers {
		var st cluster.PeerStats
		if string(id) == n.cfg.NodeID {
			st = n.gossipStats()
		} else if peer, ok := n.mem.gossip.Peer(string(id)); ok && peer.Stats != nil && time.Since(peer.StatsAt) < 5*time.Second {
			st = *peer.Stats
		} else {
			continue
		}
		lc := time.Duration(st.LastContactMS) * time.Millisecond
		if st.LastContactMS < 0 {
			lc = -1
		}
		out[id] = &autopilot.ServerStats{LastContact: lc, LastTerm: st.Term, LastIndex: st.LastIndex}
	}
	return out
}

// KnownServers lists every server of the configuration (absent from gossip:
// failed) and every alive server gossip knows.
func (p *pilot) KnownServers() map[raft.ServerID]*autopilot.Server {
	n := (*Node)(p)
	out := map[raft.ServerID]*autopilot.Server{}
	peers := map[string]cluster.Peer{}
	for _, peer := range n.mem.gossip.Peers() {
		peers[peer.ID] = peer
	}
	fut := n.cl.Raft.GetConfiguration()
	if fut.Error() != nil {
		return out
	}
	_, leader := n.cl.Raft.LeaderWithID()
	for _, s := range fut.Configuration().Servers {
		srv := &autopilot.Server{ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: autopilot.NodeFailed,
			NodeType: autopilot.NodeVoter, IsLeader: s.ID == leader, RaftVersion: raft.ProtocolVersionMax}
		if peer, ok := peers[string(s.ID)]; ok {
			srv.Version = peer.Version
			switch peer.Status {
			case "alive", "suspect":
				srv.NodeStatus = autopilot.NodeAlive
			case "left":
				srv.NodeStatus = autopilot.NodeLeft
			}
		}
		out[s.ID] = srv
	}
	return out
}

// RemoveFailedServer removes a server that has been failed for
// DeadServerTimeout (autopilot has checked quorum). Its data directory is
// recorded as removed first, so it is not re-added if it comes back.
func (p *pilot) RemoveFailedServer(srv *autopilot.Server) {
	n := (*Node)(p)
	id := string(srv.ID)
	since := n.failedSince(id)
	if since.IsZero() || time.Since(since) < n.cfg.DeadServerTimeout {
		return
	}
	n.log.Warn("removing a server that has been failed for longer than the dead server timeout",
		"server", id, "failed_for", time.Since(since).Round(time.Second), "dead_server_timeout", n.cfg.DeadServerTimeout)
	if err := n.removeServer(context.Background(), id); err != nil {
		n.log.Warn("removing a failed server", "server", id, "err", err)
	}
}

// failedSince is when gossip last saw the server change to failed or left
// (or when this leader first missed it); zero while it is alive.
func (n *Node) failedSince(id string) time.Time {
	m := n.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	if peer, ok := m.gossip.Peer(id); ok {
		if peer.Status == "alive" || peer.Status == "suspect" {
			delete(m.failedAt, id)
			return time.Time{}
		}
		return peer.Since
	}
	t, ok := m.failedAt[id]
	if !ok {
		t = time.Now()
		m.failedAt[id] = t
	}
	return t
}

// removeServer tombstones the server's data directory in the registry, then
// removes it from the Raft configuration.
func (n *Node) removeServer(ctx context.Context, id string) error {
	inc := ""
	if rec, ok := n.memberRecord(id); ok {
		inc = rec.Incarnation
	}
	if peer, ok := n.mem.gossip.Peer(id); ok && peer.Incarnation != "" {
		inc = peer.Incarnation
	}
	if res, _, err := n.propose(ctx, &fsm.Member{ID: id, Incarnation: inc, Removed: true}); err != nil {
		return err
	} else if res.Err != nil {
		return res.Err
	}
	r := n.cl.Raft
	if err := r.RemoveServer(raft.ServerID(id), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		return raftError(err)
	}
	n.log.Info("removed a server from the cluster", "server", id)
	return nil
}

// members describes every server of the configuration, and the servers
// gossip knows that are not in it, for cluster status. Health comes from
// autopilot on the leader, from gossip elsewhere.
func (n *Node) members(conf raft.Configuration, leaderID raft.ServerID) []Member {
	now := time.Now()
	isLeader := n.cl.Raft.State() == raft.Leader
	var ap *autopilot.State
	if isLeader {
		ap = n.apState.Load()
	}
	peers := map[string]cluster.Peer{}
	for _, p := range n.mem.gossip.Peers() {
		peers[p.ID] = p
	}
	var out []Member
	inConf := map[string]bool{}
	for _, s := range conf.Servers {
		id := string(s.ID)
		inConf[id] = true
		m := Member{ID: id, RaftAddr: string(s.Address), Voter: s.Suffrage == raft.Voter,
			Leader: s.ID == leaderID, Health: "unknown", Gossip: "unknown"}
		p, known := peers[id]
		if known {
			m.HTTPAddr, m.Gossip, m.Version = p.HTTP, p.Status, p.Version
		}
		switch {
		case id == n.cfg.NodeID:
			m.HTTPAddr, m.Health, m.Version = n.cfg.HTTPAddr, "healthy", Version
			if isLeader {
				t := now.UTC()
				m.LastContact = &t
			} else if lc := n.cl.Raft.LastContact(); !lc.IsZero() {
				t := lc.UTC()
				m.LastContact = &t
			} else {
				m.Health = "unknown"
			}
		case ap != nil && ap.Servers[s.ID] != nil:
			st := ap.Servers[s.ID]
			m.Health = "unhealthy"
			if st.Health.Healthy {
				m.Health = "healthy"
			}
			if st.Stats.LastContact >= 0 && (st.Stats.LastTerm > 0 || st.Stats.LastIndex > 0) {
				t := now.Add(-st.Stats.LastContact).UTC()
				m.LastContact = &t
			}
		case known && p.Stats != nil && p.Stats.LastContactMS >= 0 && now.Sub(p.StatsAt) < 5*time.Second:
			t := p.StatsAt.Add(-time.Duration(p.Stats.LastContactMS) * time.Millisecond).UTC()
			m.LastContact = &t
			m.Health = "healthy"
		}
		if known && (p.Status == "failed" || p.Status == "left") || !known && isLeader {
			m.Health = "failed"
		}
		out = append(out, m)
	}
	for _, p := range peers {
		if inConf[p.ID] || p.Status == "left" {
			continue
		}
		m := Member{ID: p.ID, RaftAddr: p.Raft, HTTPAddr: p.HTTP, Gossip: p.Status, Version: p.Version, Health: "joining"}
		rec, ok := n.memberRecord(p.ID)
		switch {
		case ok && rec.Removed && rec.Incarnation == p.Incarnation:
			m.Health = "removed"
		case p.HasState && !(ok && rec.Incarnation == p.Incarnation):
			m.Health = "refused"
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
