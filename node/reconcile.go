package node

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The leader reconciles gossip membership with the Raft configuration
// (cluster.Reconcile, cluster.RunAutopilot); the node lends the cluster
// its member registry, kept in the replicated state (registry below), and
// checks on each pass what its own features need of the configuration.

// reconciler runs the leader's reconciliation for the node.
type reconciler struct{ n *Node }

// membership is what the cluster reconciles the configuration with.
func (rc *reconciler) membership() cluster.Membership {
	n := rc.n
	return cluster.Membership{Gossip: n.mem.Gossip(), Registry: registry{n}, ClusterID: n.mem.ClusterID, Self: n.mem.Stats,
		DeadServerTimeout: n.cfg.DeadServerTimeout, MinQuorum: n.cfg.MinQuorum, StabilizationTime: n.cfg.StabilizationTime,
		ApplyTimeout: n.cfg.ApplyTimeout}
}

// reconcileLoop runs on the leader for one term.
func (rc *reconciler) reconcileLoop(ctx context.Context) {
	m := rc.membership()
	go rc.n.cl.RunAutopilot(ctx, m)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		rc.reconcile(ctx, m)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-rc.n.mem.Changed():
		}
	}
}

// reconcile does one pass: what this server's features learn from the
// configuration (the cluster id, the sealing check, which entry formats
// every server reads), then the cluster's reconciliation.
func (rc *reconciler) reconcile(ctx context.Context, m cluster.Membership) {
	conf, err := rc.n.cl.Configuration()
	if err != nil {
		return
	}
	ids := make([]string, 0, len(conf.Servers))
	for _, s := range conf.Servers {
		ids = append(ids, string(s.ID))
	}
	rc.n.mem.RecordClusterID(ctx, ids)
	rc.n.sg.recordSealCheck(ctx, ids)
	rc.n.tk.updateChunkedExpiry(ids)
	rc.n.gc.updateEntryCRC(ids)
	rc.n.recordFeatures(ctx, ids)
	rc.n.cl.Reconcile(ctx, conf, m)
	// Grant keys after the member records the pass made.
	rc.n.gk.recordKeys(ctx, ids)
}

// registry is the member registry in the replicated state, as the cluster
// uses it.
type registry struct{ n *Node }

func (r registry) Member(id string) (cluster.MemberRecord, bool) {
	rec, ok := r.n.rc.memberRecord(id)
	return cluster.MemberRecord{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed}, ok
}

func (r registry) Members() []cluster.MemberRecord {
	r.n.rep.mu.RLock()
	recs := r.n.rep.f.Members()
	r.n.rep.mu.RUnlock()
	out := make([]cluster.MemberRecord, len(recs))
	for i, rec := range recs {
		out[i] = cluster.MemberRecord{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed, Index: rec.Index}
	}
	return out
}

func (r registry) Record(ctx context.Context, rec cluster.MemberRecord) error {
	res, _, err := r.n.propose(ctx, &fsm.Member{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed})
	if err != nil {
		return err
	}
	if res.Err != nil {
		return res.Err
	}
	return nil
}

func (rc *reconciler) memberRecord(id string) (fsm.MemberRecord, bool) {
	rc.n.rep.mu.RLock()
	defer rc.n.rep.mu.RUnlock()
	return rc.n.rep.f.Member(id)
}

// removeServer tombstones the server's data directory in the registry, then
// removes it from the Raft configuration.
func (rc *reconciler) removeServer(ctx context.Context, id string) error {
	err := rc.n.cl.RemoveMember(ctx, id, rc.membership())
	var ce *cluster.ConfigChangeError
	if errors.As(err, &ce) {
		return raftError(ce.Err)
	}
	return err
}

// members describes every server of the configuration, and the servers
// gossip knows that are not in it, for cluster status. Health comes from
// autopilot on the leader, from gossip elsewhere.
func (rc *reconciler) members(conf cluster.Configuration, leaderID string) []wire.Member {
	now := time.Now()
	isLeader := rc.n.cl.IsLeader()
	var ap map[string]cluster.ServerHealth
	if isLeader {
		ap = rc.n.cl.ServerHealth()
	}
	peers := map[string]cluster.Peer{}
	for _, p := range rc.n.mem.Gossip().Peers() {
		peers[p.ID] = p
	}
	var out []wire.Member
	inConf := map[string]bool{}
	for _, s := range conf.Servers {
		id := s.ID
		inConf[id] = true
		m := wire.Member{ID: id, RaftAddr: s.Address, Voter: s.Voter,
			Leader: s.ID == leaderID, Health: "unknown", Gossip: "unknown"}
		p, known := peers[id]
		st, inAP := ap[id]
		if known {
			m.HTTPAddr, m.Gossip, m.Version = p.HTTP, p.Status, p.Version
		}
		switch {
		case id == rc.n.cfg.NodeID:
			m.HTTPAddr, m.Health, m.Version = rc.n.cfg.HTTPAddr, "healthy", rc.n.cfg.version()
			if isLeader {
				t := now.UTC()
				m.LastContact = &t
			} else if lc := rc.n.cl.LastContact(); !lc.IsZero() {
				t := lc.UTC()
				m.LastContact = &t
			} else {
				m.Health = "unknown"
			}
		case inAP:
			m.Health = "unhealthy"
			if st.Healthy {
				m.Health = "healthy"
			}
			if st.LastContact >= 0 && (st.LastTerm > 0 || st.LastIndex > 0) {
				t := now.Add(-st.LastContact).UTC()
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
		m := wire.Member{ID: p.ID, RaftAddr: p.Raft, HTTPAddr: p.HTTP, Gossip: p.Status, Version: p.Version, Health: "joining"}
		rec, ok := rc.memberRecord(p.ID)
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
