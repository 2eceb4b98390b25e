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
type reconciler struct {
	cfg *Config
	rep *replica
	cl  *cluster.Cluster // set once Raft runs
	mem *cluster.Members
	// What each pass updates from the configuration: the cluster id, the
	// sealing check, the tick and entry formats, the recorded features
	// and the grant keys.
	sg             *sealGuard
	tk             *ticker
	gc             *groupCommit
	gk             *grantKeys
	recordFeatures func(context.Context, []string)
	// admit says why a new server may not join (cluster.Membership.Admit).
	admit func(cluster.Peer) error
	// propose commits the registry's member records.
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
}

// membership is what the cluster reconciles the configuration with.
func (rc *reconciler) membership() cluster.Membership {
	return cluster.Membership{Gossip: rc.mem.Gossip(), Registry: registry{rc}, ClusterID: rc.mem.ClusterID, Self: rc.mem.Stats,
		DeadServerTimeout: rc.cfg.DeadServerTimeout, MinQuorum: rc.cfg.MinQuorum, StabilizationTime: rc.cfg.StabilizationTime,
		ApplyTimeout: rc.cfg.ApplyTimeout, Admit: rc.admit}
}

// reconcileLoop runs on the leader for one term.
func (rc *reconciler) reconcileLoop(ctx context.Context) {
	m := rc.membership()
	go rc.cl.RunAutopilot(ctx, m)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		rc.reconcile(ctx, m)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-rc.mem.Changed():
		}
	}
}

// reconcile does one pass: what this server's features learn from the
// configuration (the cluster id, the sealing check, which entry formats
// every server reads), then the cluster's reconciliation.
func (rc *reconciler) reconcile(ctx context.Context, m cluster.Membership) {
	conf, err := rc.cl.Configuration()
	if err != nil {
		return
	}
	ids := make([]string, 0, len(conf.Servers))
	for _, s := range conf.Servers {
		ids = append(ids, s.ID)
	}
	rc.mem.RecordClusterID(ctx, ids)
	rc.sg.recordSealCheck(ctx, ids)
	rc.tk.updateChunkedExpiry(ids)
	rc.gc.updateEntryCRC(ids)
	rc.recordFeatures(ctx, ids)
	rc.cl.Reconcile(ctx, conf, m)
	// Grant keys after the member records the pass made.
	rc.gk.recordKeys(ctx, ids)
}

// registry is the member registry in the replicated state, as the cluster
// uses it.
type registry struct{ rc *reconciler }

func (r registry) Member(id string) (cluster.MemberRecord, bool) {
	rec, ok := r.rc.memberRecord(id)
	return cluster.MemberRecord{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed}, ok
}

func (r registry) Members() []cluster.MemberRecord {
	r.rc.rep.mu.RLock()
	recs := r.rc.rep.f.Members()
	r.rc.rep.mu.RUnlock()
	out := make([]cluster.MemberRecord, len(recs))
	for i, rec := range recs {
		out[i] = cluster.MemberRecord{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed, Index: rec.Index}
	}
	return out
}

func (r registry) Record(ctx context.Context, rec cluster.MemberRecord) error {
	res, _, err := r.rc.propose(ctx, &fsm.Member{ID: rec.ID, Incarnation: rec.Incarnation, Removed: rec.Removed})
	if err != nil {
		return err
	}
	if res.Err != nil {
		return res.Err
	}
	return nil
}

func (rc *reconciler) memberRecord(id string) (fsm.MemberRecord, bool) {
	rc.rep.mu.RLock()
	defer rc.rep.mu.RUnlock()
	return rc.rep.f.Member(id)
}

// removeServer tombstones the server's data directory in the registry, then
// removes it from the Raft configuration.
func (rc *reconciler) removeServer(ctx context.Context, id string) error {
	err := rc.cl.RemoveMember(ctx, id, rc.membership())
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
	isLeader := rc.cl.IsLeader()
	var ap map[string]cluster.ServerHealth
	if isLeader {
		ap = rc.cl.ServerHealth()
	}
	peers := map[string]cluster.Peer{}
	for _, p := range rc.mem.Gossip().Peers() {
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
		case id == rc.cfg.NodeID:
			m.HTTPAddr, m.Health, m.Version = rc.cfg.HTTPAddr, "healthy", rc.cfg.version()
			if isLeader {
				t := now.UTC()
				m.LastContact = &t
			} else if lc := rc.cl.LastContact(); !lc.IsZero() {
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
		case rc.admit != nil:
			if err := rc.admit(p); err != nil {
				m.Health, m.Reason = "refused", err.Error()
			}
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
