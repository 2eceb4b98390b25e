package cluster

import (
	"context"
	"time"
)

// Members' cluster identity: the id this server goes by, the data
// directory's copy kept equal to the replicated one, and recording one on
// the leader.

// identity is the cluster id exchange's view of this server.
func (m *Members) identity() *Identity {
	return &Identity{ClusterID: m.ClusterID, Admit: m.admitRaft,
		OnConflict: func(string, string) { m.conflictAt.Store(time.Now().UnixNano()) }, Legacy: m.legacyPeer}
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
