package node

import (
	"context"
	"fmt"
	"net"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// The server's membership (gossip, join and re-join, bootstrap-expect,
// admission, the refusal state and the cluster identity) is
// cluster.Members; the node lends it what lives in its replicated state
// (the member registry, the cluster id), the features it announces and its
// resources.

// newMembers makes the server's cluster.Members.
func newMembers(n *Node) (*cluster.Members, error) {
	cfg := n.cfg
	dir := cfg.DataDir
	if cfg.InMemory {
		dir = ""
	}
	host, err := advertiseHost(cfg)
	if err != nil {
		return nil, err
	}
	bind := cfg.GossipAddr
	if h, _, err := net.SplitHostPort(bind); err == nil && cfg.InMemory && !cfg.keepGossipPort {
		bind = net.JoinHostPort(h, "0")
	}
	return cluster.NewMembers(cluster.MembersConfig{
		NodeID: cfg.NodeID, Dir: dir, ValidClusterID: validClusterID,
		GossipAddr: bind, Advertise: host, GossipKey: cfg.GossipKey, FastGossip: cfg.FastGossip, WrapGossip: cfg.WrapGossip,
		Join: cfg.Join, JoinTimeout: cfg.JoinTimeout, BootstrapExpect: cfg.BootstrapExpect,
		Registry: registry{&n.rc}, IDs: replicatedID{n}, Meta: n.gossipMeta, Resources: n.gossipResources,
		OnPass: func() { n.sg.checkSeal() }, Stop: n.closing, Logger: n.log,
	})
}

func validClusterID(s string) error {
	if e := fsm.ValidClusterID(s); e != nil {
		return e
	}
	return nil
}

// replicatedID is the cluster id in the replicated state.
type replicatedID struct{ n *Node }

func (r replicatedID) ClusterID() string {
	r.n.rep.mu.RLock()
	defer r.n.rep.mu.RUnlock()
	return r.n.rep.f.ClusterID()
}

func (r replicatedID) ProposeClusterID(ctx context.Context, id string) error {
	res, _, err := r.n.propose(ctx, &fsm.ClusterID{ID: id})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	return err
}

// gossipMeta is what this server announces besides its identity: its HTTP
// address, its version and the features it reads.
func (n *Node) gossipMeta() cluster.Meta {
	return cluster.Meta{HTTP: n.cfg.HTTPAddr, Version: n.cfg.version(), SealCheck: true, ChunkedExpiry: true, RestoreLog: true, EntryCRC: true, Features: true,
		RenewMeta: true, GrantKey: n.gk.pubB64, LeaseGroups: true, SessionMeta: true, RestoreBounds: true,
		ChunkedPrune: true}
}

// gossipResources is this server's disk and memory as ping acks carry them.
func (n *Node) gossipResources() cluster.PeerStats {
	return cluster.PeerStats{DiskLow: n.disk.low.Load(), DiskFree: max(n.disk.free.Load(), 0), MemLimit: n.bk.memLimit()}
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

// refusedErr is set when the cluster removed or refused this server
// (cluster.Members.Refused), or when its sealing key does not match the
// cluster's (checkSeal).
func (n *Node) refusedErr() error {
	if e := n.sg.sealRefused.Load(); e != nil {
		return *e
	}
	return n.mem.Refused()
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
	p, ok := n.mem.Gossip().Peer(string(id))
	if !ok || p.HTTP == "" {
		return LeaderInfo{ID: string(id), RaftAddr: string(addr)}, false
	}
	return LeaderInfo{ID: string(id), HTTPAddr: p.HTTP, RaftAddr: string(addr)}, true
}

// NodeID is this node's id.
func (n *Node) NodeID() string { return n.cfg.NodeID }
