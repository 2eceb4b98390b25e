package node

import (
	"context"
	"strconv"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The cluster as an operator sees and changes it: its status, removing a
// member, moving leadership. None of these ends or shortens a lease.

// ClusterStatus describes the cluster as this node sees it.
//
// With stale false the read is linearizable (only the leader answers, after
// confirming its leadership), so its tick is at least every tick committed
// before the call: the chaos suite's clock checker relies on that. With
// stale true it is this node's own view, whatever its role.
func (n *Node) ClusterStatus(ctx context.Context, stale bool) (*wire.ClusterStatus, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	r := n.cl
	st := r.Stats()
	term, _ := strconv.ParseUint(st["term"], 10, 64)
	leaderAddr, leaderID := r.Leader()
	n.rep.mu.RLock()
	tick, period := n.rep.f.Tick(), n.rep.period()
	leases, sessions := n.rep.f.Counts()
	n.rep.mu.RUnlock()
	out := &wire.ClusterStatus{
		NodeID: n.cfg.NodeID, Leader: string(leaderID), LeaderAddr: string(leaderAddr),
		State: string(r.State()), Term: term, CommitIndex: r.CommitIndex(),
		AppliedIndex: n.rep.applied.Load(), Tick: tick, TickPeriodMS: period,
		ActiveLeases: leases, ActiveSession: sessions,
	}
	conf, err := r.Configuration()
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "read raft configuration: " + err.Error()}
	}
	out.Members = n.rc.members(conf, leaderID)
	return out, nil
}

// RemoveMember removes a server from the Raft configuration. It never ends
// or shortens a lease. Only the leader can do it. The removed server is not
// re-added while it runs with the same data directory.
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	r := n.cl
	if !r.IsLeader() {
		return n.noLeader()
	}
	conf, err := r.Configuration()
	if err != nil {
		return &wire.Error{Code: wire.CodeInternal, Message: err.Error()}
	}
	found := false
	for _, s := range conf.Servers {
		found = found || string(s.ID) == id
	}
	if !found {
		return &wire.Error{Code: wire.CodeNotFound, Message: "no member " + strconv.Quote(id)}
	}
	if id == n.cfg.NodeID && len(conf.Servers) == 1 {
		return fsm.InvalidField("id", "cannot remove the only member of the cluster")
	}
	// Tombstone the server's data directory first: if it comes back, it is
	// not re-added (wiping its data directory lets it join anew).
	return n.rc.removeServer(ctx, id)
}

// TransferLeadership asks the leader to hand over to id (any up-to-date
// voter when id is empty).
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	r := n.cl
	if !r.IsLeader() {
		return n.noLeader()
	}
	var err error
	if id == "" {
		err = r.TransferLeadership()
	} else {
		conf, cerr := r.Configuration()
		if cerr != nil {
			return &wire.Error{Code: wire.CodeInternal, Message: cerr.Error()}
		}
		var addr string
		for _, s := range conf.Servers {
			if s.ID == id {
				addr = s.Address
			}
		}
		if addr == "" {
			return &wire.Error{Code: wire.CodeNotFound, Message: "no member " + strconv.Quote(id)}
		}
		err = r.TransferLeadershipTo(id, addr)
	}
	if err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "leadership transfer failed: " + err.Error()}
	}
	return nil
}
