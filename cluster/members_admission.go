package cluster

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Members' admission and refusal: whether a new or wiped server may take
// Raft traffic, and the record of why the cluster refuses this server.

// Refused is set when the cluster removed this server, or when gossip
// shows its id belongs to another cluster than its data directory's.
func (m *Members) Refused() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
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

// refuse records why the cluster refuses this server; it reports whether
// it is the first reason.
func (m *Members) refuse(err error) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := m.refused == nil
	m.refused = err
	return first
}
