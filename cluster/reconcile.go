package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// The leader reconciles gossip membership with the Raft configuration: a
// new server (one whose data directory the registry does not know as
// removed, and that Membership.Admit does not refuse) is added as a non-voter and autopilot promotes it to voter once
// it has been healthy for StabilizationTime. Failed servers are only
// reported, unless DeadServerTimeout is set; then autopilot removes them,
// never below MinQuorum voters and never a majority at once.
//
// Which data directory (incarnation) each server runs with, and which were
// removed, is the member registry: the server keeps it in its replicated
// state and lends it to the cluster through Registry.

// MemberRecord is the registry's record of one server.
type MemberRecord struct {
	ID          string
	Incarnation string // the server's data directory
	Removed     bool   // that data directory was removed from the cluster
	Index       uint64 // the log index of the entry that wrote it (Members only)
}

// Registry is the member registry as the cluster uses it.
type Registry interface {
	// Member is id's record, if any.
	Member(id string) (MemberRecord, bool)
	// Record commits rec (through the log) and returns once it applied.
	Record(ctx context.Context, rec MemberRecord) error
	// Members is every record (gossiped to the others).
	Members() []MemberRecord
}

// Membership is what the leader reconciles the configuration with.
type Membership struct {
	Gossip   *Gossip
	Registry Registry
	// ClusterID is this cluster's identity ("" while unknown).
	ClusterID func() string
	// Self is this server's own Raft view (it is not in its own gossip
	// ping acks).
	Self func() PeerStats
	// DeadServerTimeout, if positive, removes a server failed for that
	// long (autopilot checks quorum first); MinQuorum bounds it. Default
	// (0, or negative): off.
	DeadServerTimeout time.Duration
	MinQuorum         int
	// StabilizationTime: how long a new server must be healthy before it
	// is promoted to voter. Default (0, or negative): at once.
	StabilizationTime time.Duration
	// ApplyTimeout bounds configuration changes. Default (0): Raft's, no
	// bound.
	ApplyTimeout time.Duration
	// Admit, if set, says why a new server may not be added (nil: it
	// may), for the server's own reasons: a feature its state records
	// that the peer does not announce. A refused server is neither
	// recorded nor added, as a voter or a non-voter; Reconcile logs the
	// reason once per server and reason.
	Admit func(Peer) error
}

// refusals is the reason each new server was last refused for (Admit),
// so that a pass every second does not repeat it in the log.
type refusals struct {
	mu sync.Mutex
	by map[string]string
}

// failures is when each server of the configuration was first missed.
type failures struct {
	mu sync.Mutex
	at map[string]time.Time
}

// RunAutopilot runs autopilot for the leadership term of ctx, and returns
// once it has stopped.
func (c *Cluster) RunAutopilot(ctx context.Context, m Membership) {
	ap := c.newAutopilot(&pilot{c: c, m: m},
		autopilot.WithLogger(HCLogger("autopilot", c.logger)),
		autopilot.WithReconcileInterval(time.Second),
		autopilot.WithUpdateInterval(500*time.Millisecond))
	ap.Start(ctx)
	<-ctx.Done()
	<-ap.Stop()
}

// Reconcile does one pass on the leader: record the data directory of
// every server in the configuration, replace a member that came back with
// another data directory, update the Raft address of one that came back
// with the same data directory at another address, and add alive servers
// that are not in it.
func (c *Cluster) Reconcile(ctx context.Context, conf Configuration, m Membership) {
	inConf := map[string]bool{}
	addrOf := map[string]string{}
	for _, s := range conf.Servers {
		inConf[s.ID] = true
		addrOf[s.ID] = s.Address
	}
	ours := m.ClusterID()
	for _, p := range m.Gossip.Peers() {
		rec, known := m.Registry.Member(p.ID)
		switch {
		case inConf[p.ID]:
			// Record the data directory the server runs with, once.
			if p.Status == "alive" && p.Incarnation != "" && !known {
				m.Registry.Record(ctx, MemberRecord{ID: p.ID, Incarnation: p.Incarnation})
			}
			// A member that came back with another data directory (wiped or
			// replaced) has lost its log: it must neither vote nor count
			// toward a quorum. Remove the old member (a tombstone of the
			// old data directory); the new one is added back as a new server
			// below if it may be.
			if p.Status == "alive" && p.Incarnation != "" && known && !rec.Removed &&
				rec.Incarnation != p.Incarnation && p.ID != c.cfg.NodeID {
				c.replaceWiped(ctx, p, rec, m)
			}
			// The same server (its data directory, as recorded) at
			// another address: a new IP after a restart. This one too: a
			// server that came back at another address and won an election
			// before a leader updated it must update its own entry, or the
			// others dial the address it left once it no longer leads.
			if p.Status == "alive" && p.Raft != "" && known && !rec.Removed && rec.Incarnation == p.Incarnation &&
				p.Raft != addrOf[p.ID] &&
				(p.ClusterID == "" || ours == "" || p.ClusterID == ours) {
				c.updateAddress(p, addrOf[p.ID], m)
			}
		case p.Status != "alive" || p.Raft == "" || p.Incarnation == "":
		case known && rec.Removed && rec.Incarnation == p.Incarnation:
			// Removed: it stays out until its data directory is wiped.
		case p.ClusterID != "" && p.ClusterID != ours && ours != "":
			c.logger.Warn("a server of another cluster is in gossip; Raft traffic with it is refused",
				"server", p.ID, "its_cluster", p.ClusterID, "cluster", ours, "raft_addr", p.Raft)
		case !p.HasState || known && rec.Incarnation == p.Incarnation || p.ClusterID != "" && p.ClusterID == ours:
			// A new server (or one added before whose join did not finish).
			if !c.admit(p, m) {
				continue
			}
			if err := m.Registry.Record(ctx, MemberRecord{ID: p.ID, Incarnation: p.Incarnation}); err != nil {
				continue
			}
			c.logger.Info("adding a new server as non-voter", "server", p.ID, "raft_addr", p.Raft)
			if err := c.AddNonvoter(p.ID, p.Raft, m.ApplyTimeout); err != nil {
				c.logger.Warn("adding a server failed", "server", p.ID, "err", err)
			}
		default:
			// Raft state of another cluster, or of one this cluster no longer
			// knows: never merged silently.
			c.logger.Warn("a server with Raft state that is not a member tries to join; ignoring it",
				"server", p.ID, "raft_addr", p.Raft)
		}
	}
}

// admit reports whether m.Admit lets new server p be added, and logs a
// refusal when its reason is new.
func (c *Cluster) admit(p Peer, m Membership) bool {
	var err error
	if m.Admit != nil {
		err = m.Admit(p)
	}
	r := &c.refused
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.by, p.ID)
		return true
	}
	if r.by == nil {
		r.by = map[string]string{}
	}
	if r.by[p.ID] != err.Error() {
		r.by[p.ID] = err.Error()
		c.logger.Warn("a new server is not added to the cluster: "+err.Error(),
			"server", p.ID, "raft_addr", p.Raft, "version", p.Version)
	}
	return false
}

// replaceWiped removes server p, whose data directory is not the one the
// registry recorded (rec): the old data directory is tombstoned, so the new
// one can join as a new server.
func (c *Cluster) replaceWiped(ctx context.Context, p Peer, rec MemberRecord, m Membership) {
	c.logger.Warn("a member came back with another data directory (wiped or replaced); removing the old member",
		"server", p.ID, "recorded_incarnation", rec.Incarnation, "incarnation", p.Incarnation, "its_cluster", p.ClusterID)
	if err := m.Registry.Record(ctx, MemberRecord{ID: p.ID, Incarnation: rec.Incarnation, Removed: true}); err != nil {
		c.logger.Warn("removing a wiped member: recording failed", "server", p.ID, "err", err)
		return
	}
	if err := c.RemoveServer(p.ID, m.ApplyTimeout); err != nil {
		c.logger.Warn("removing a wiped member failed", "server", p.ID, "err", err)
		return
	}
	c.logger.Info("removed the old member of a wiped server", "server", p.ID)
}

// updateAddress gives member p, which came back with the data directory
// the registry recorded for it, the Raft address it now advertises (was
// old): the leader replicates to the new one once the change commits. Its
// suffrage stays as it is (raft's AddNonvoter of a voter changes only its
// address).
func (c *Cluster) updateAddress(p Peer, old string, m Membership) {
	c.logger.Warn("a member came back at another Raft address; updating it", "server", p.ID, "raft_addr", p.Raft, "was", old)
	if err := c.raft.AddNonvoter(raft.ServerID(p.ID), raft.ServerAddress(p.Raft), 0, m.ApplyTimeout).Error(); err != nil {
		c.logger.Warn("updating a member's Raft address failed", "server", p.ID, "err", err)
		return
	}
	c.logger.Info("updated a member's Raft address", "server", p.ID, "raft_addr", p.Raft, "was", old)
}

// ConfigChangeError is a Raft configuration change that failed (classify
// Err with ClassifyApply).
type ConfigChangeError struct{ Err error }

func (e *ConfigChangeError) Error() string { return "configuration change: " + e.Err.Error() }
func (e *ConfigChangeError) Unwrap() error { return e.Err }

// RemoveMember tombstones the server's data directory in the registry,
// then removes it from the Raft configuration. The registry's error is
// returned as it is; a failed configuration change as a
// *ConfigChangeError.
func (c *Cluster) RemoveMember(ctx context.Context, id string, m Membership) error {
	inc := ""
	if rec, ok := m.Registry.Member(id); ok {
		inc = rec.Incarnation
	}
	if peer, ok := m.Gossip.Peer(id); ok && peer.Incarnation != "" {
		inc = peer.Incarnation
	}
	if err := m.Registry.Record(ctx, MemberRecord{ID: id, Incarnation: inc, Removed: true}); err != nil {
		return err
	}
	if err := c.RemoveServer(id, m.ApplyTimeout); err != nil {
		return &ConfigChangeError{Err: err}
	}
	c.logger.Info("removed a server from the cluster", "server", id)
	return nil
}

// failedSince is when gossip last saw the server change to failed or left
// (or when this leader first missed it); zero while it is alive.
func (c *Cluster) failedSince(g *Gossip, id string) time.Time {
	f := &c.failed
	f.mu.Lock()
	defer f.mu.Unlock()
	if peer, ok := g.Peer(id); ok {
		if peer.Status == "alive" || peer.Status == "suspect" {
			delete(f.at, id)
			return time.Time{}
		}
		return peer.Since
	}
	if f.at == nil {
		f.at = map[string]time.Time{}
	}
	t, ok := f.at[id]
	if !ok {
		t = time.Now()
		f.at[id] = t
	}
	return t
}

// pilot is autopilot's application integration.
type pilot struct {
	c *Cluster
	m Membership
}

func (p *pilot) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      p.m.DeadServerTimeout > 0,
		LastContactThreshold:    2 * time.Second,
		MaxTrailingLogs:         4096,
		MinQuorum:               uint(p.m.MinQuorum),
		ServerStabilizationTime: p.m.StabilizationTime,
	}
}

// NotifyState: the cluster keeps autopilot's state (ServerHealth,
// through recordingPilot).
func (p *pilot) NotifyState(*autopilot.State) {}

// FetchServerStats answers from the Raft views servers attach to gossip
// ping acks (at most a few seconds old) and this server's own.
func (p *pilot) FetchServerStats(_ context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	out := make(map[raft.ServerID]*autopilot.ServerStats, len(servers))
	for id := range servers {
		var st PeerStats
		if string(id) == p.c.cfg.NodeID {
			st = p.m.Self()
		} else if peer, ok := p.m.Gossip.Peer(string(id)); ok && peer.Stats != nil && time.Since(peer.StatsAt) < 5*time.Second {
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
// failed).
func (p *pilot) KnownServers() map[raft.ServerID]*autopilot.Server {
	out := map[raft.ServerID]*autopilot.Server{}
	peers := map[string]Peer{}
	for _, peer := range p.m.Gossip.Peers() {
		peers[peer.ID] = peer
	}
	conf, err := p.c.raftConfiguration()
	if err != nil {
		return out
	}
	_, leader := p.c.Leader()
	for _, s := range conf.Servers {
		srv := &autopilot.Server{ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: autopilot.NodeFailed,
			NodeType: autopilot.NodeVoter, IsLeader: string(s.ID) == leader, RaftVersion: raft.ProtocolVersionMax}
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
	id := string(srv.ID)
	since := p.c.failedSince(p.m.Gossip, id)
	if since.IsZero() || time.Since(since) < p.m.DeadServerTimeout {
		return
	}
	p.c.logger.Warn("removing a server that has been failed for longer than the dead server timeout",
		"server", id, "failed_for", time.Since(since).Round(time.Second), "dead_server_timeout", p.m.DeadServerTimeout)
	if err := p.c.RemoveMember(context.Background(), id, p.m); err != nil {
		p.c.logger.Warn("removing a failed server", "server", id, "err", err)
	}
}
