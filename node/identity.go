package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// The cluster identity (fsm/clusterid.go): a server learns it when it
// bootstraps alone (it makes it) or from the replicated state (a ClusterID entry
// or a snapshot), and keeps it in the data directory (cluster-id) so that
// it is known at the next start before any entry is applied. Raft
// connections start with an exchange of ids (cluster.Identity): servers of
// two clusters never exchange Raft traffic. A data directory from before
// identities has none; the next leader proposes one (the id in its file,
// or a new random one), and every server adopts it as it applies it; so
// does a cluster formed by bootstrap-expect (its servers cannot be of
// another cluster: one with state never takes part in a bootstrap).

// identity holds this server's cluster id: the data directory's copy
// (cluster.LocalID) and the replicated one.
type identity struct {
	n     *Node
	local *cluster.LocalID
}

func loadClusterID(cfg Config) (*identity, error) {
	dir := cfg.DataDir
	if cfg.InMemory {
		dir = ""
	}
	l, err := cluster.OpenLocalID(dir, func(s string) error {
		if e := fsm.ValidClusterID(s); e != nil {
			return e
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &identity{local: l}, nil
}

func (i *identity) get() string { return i.local.Get() }

// set makes id this server's cluster id and writes it to the data directory
// (once per change).
func (i *identity) set(id string) error { return i.local.Set(id) }

// clusterID is the id this server goes by: the replicated one once
// applied, else the one in its data directory; "" when it has none.
func (ci *identity) clusterID() string {
	ci.n.rep.mu.RLock()
	id := ci.n.rep.f.ClusterID()
	ci.n.rep.mu.RUnlock()
	if id != "" {
		return id
	}
	return ci.get()
}

// syncClusterID keeps the data directory's id equal to the replicated one.
func (ci *identity) syncClusterID() {
	ci.n.rep.mu.RLock()
	id := ci.n.rep.f.ClusterID()
	ci.n.rep.mu.RUnlock()
	if id == "" || id == ci.get() {
		return
	}
	if old := ci.get(); old != "" {
		ci.n.log.Warn("the replicated cluster id differs from the data directory's; taking the replicated one", "cluster_id", id, "was", old)
	}
	if err := ci.set(id); err != nil {
		ci.n.log.Error("recording the cluster id", "err", err)
		return
	}
	ci.n.mem.gossip.UpdateMeta()
}

// recordClusterID runs on the leader (each reconcile pass): a state without
// an id (a new cluster, or one from before identities) gets this server's,
// or a new one; but only once gossip shows every server of the
// configuration runs a version that knows the ClusterID entry (an earlier
// version stops on an entry type it does not know: a rolling upgrade
// records the id once it is complete).
func (ci *identity) recordClusterID(ctx context.Context, conf raft.Configuration) {
	ci.n.rep.mu.RLock()
	have := ci.n.rep.f.ClusterID()
	ci.n.rep.mu.RUnlock()
	if have != "" {
		return
	}
	for _, s := range conf.Servers {
		if string(s.ID) == ci.n.cfg.NodeID {
			continue
		}
		if p, ok := ci.n.mem.gossip.Peer(string(s.ID)); !ok || !p.RaftHello {
			return
		}
	}
	id := ci.get()
	if id == "" {
		id = cluster.NewClusterID()
	}
	res, _, err := ci.n.propose(ctx, &fsm.ClusterID{ID: id})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		if ctx.Err() == nil {
			ci.n.log.Warn("leadership: recording the cluster id failed", "err", err)
		}
		return
	}
	ci.n.log.Info("recorded the cluster id", "cluster_id", id)
	ci.syncClusterID()
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
func (ci *identity) admitRaft(peerCluster string) error {
	if ci.n.hadState.Load() {
		return nil
	}
	m := ci.n.mem
	m.mu.Lock()
	v := m.remote
	m.mu.Unlock()
	var err error
	switch {
	case v == nil && peerCluster == "":
	case v == nil:
		err = errors.New("this server has no Raft state and has not heard from the cluster through gossip yet")
	case v.ClusterID != "" && peerCluster != "" && v.ClusterID != peerCluster:
		err = fmt.Errorf("gossip names cluster %s, the peer is of cluster %s", v.ClusterID, peerCluster)
	default:
		if rec, ok := v.member(ci.n.cfg.NodeID); ok && v.hasServer(ci.n.cfg.NodeID) && !rec.Removed && rec.Incarnation != m.incarnation {
			err = fmt.Errorf("the cluster still lists %s as a voter with another data directory (%s, this one %s): "+
				"waiting for its leader to replace the old member", ci.n.cfg.NodeID, rec.Incarnation, m.incarnation)
		}
	}
	if err != nil {
		ci.n.gated.Store(time.Now().UnixNano())
	}
	return err
}

// legacyPeer: gossip shows the server at Raft address addr runs a version
// whose Raft connections do not start with the cluster id exchange.
func (ci *identity) legacyPeer(addr raft.ServerAddress) bool {
	g := ci.n.mem.gossip
	if g == nil {
		return false
	}
	for _, p := range g.Peers() {
		if p.Raft == string(addr) && p.Version != "" {
			return !p.RaftHello
		}
	}
	return false
}

// otherClusterErr says what the operator must do when gossip shows that this
// server's id belongs to cluster theirs while this data directory holds
// cluster ours.
func (ci *identity) otherClusterErr(ours, theirs string, v *clusterView) error {
	return fmt.Errorf("this server (%s) holds cluster %s, but cluster %s (servers %s) knows its id: "+
		"its data directory was wiped or replaced and it formed a new cluster on its own at start. "+
		"It exchanges no Raft traffic with cluster %s and serves nothing. Stop it, wipe its data directory "+
		"and start it with --join naming a server of cluster %s (the leader replaces the old member); "+
		"do not start a wiped server without --join",
		ci.n.cfg.NodeID, ours, theirs, strings.Join(v.Servers, ","), theirs, theirs)
}
