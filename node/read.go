package node

import (
	"context"
	"strconv"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
)

// readBarrier makes a linearizable read possible: this node confirms it is
// still the leader (a quorum answered after the read began) and waits until
// it has applied everything committed before that moment. A stale read
// skips it and answers from whatever this node has applied. A server the
// cluster refused (refusedErr) serves no linearizable read.
func (n *Node) readBarrier(ctx context.Context, stale bool) error {
	if stale || canaryStaleRead {
		return nil
	}
	if err := n.refusedErr(); err != nil {
		return &Error{Code: fsm.CodeUnavailable, Message: err.Error()}
	}
	if n.cl.Raft.State() != raft.Leader || !n.isLeaderReady() {
		return n.noLeader()
	}
	commit := n.cl.Raft.CommitIndex()
	if err := n.cl.Raft.VerifyLeader().Error(); err != nil {
		return n.noLeader()
	}
	for {
		ch, applied := n.rep.waitApplied()
		if applied >= commit {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return n.noLeader()
		}
	}
}

func (n *Node) noLeader() error {
	msg := "this node is not the leader and no leader is known"
	if _, id := n.cl.Raft.LeaderWithID(); string(id) == n.cfg.NodeID {
		msg = "this node was just elected leader and is still applying its predecessors' entries; retry shortly"
	} else if addr, id := n.cl.Raft.LeaderWithID(); addr != "" {
		msg = "this node is not the leader; the leader is " + string(id) + " at " + string(addr)
	}
	return &Error{Code: CodeNoLeader, Message: msg}
}

// GetLease returns a lease in any retained state.
func (n *Node) GetLease(ctx context.Context, id string, stale bool) (*Lease, error) {
	if err := checkID("lease", id); err != nil {
		return nil, err
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	l := n.rep.f.Lease(id)
	if l == nil {
		return nil, fsm.Errorf(CodeLeaseNotFound, "lease %s not found", id)
	}
	return n.rep.view(l, wallNow()), nil
}

// ListLeases returns one page of leases ordered by id.
func (n *Node) ListLeases(ctx context.Context, r ListRequest, stale bool) (*LeaseList, error) {
	switch fsm.State(r.State) {
	case "", fsm.StateActive, fsm.StateReleased, fsm.StateExpired, fsm.StateRevoked:
	default:
		return nil, fsm.InvalidField("state", "state must be active, released, expired or revoked")
	}
	if r.Limit < 0 || r.Limit > 1000 {
		return nil, fsm.InvalidField("limit", "limit must be 1-1000")
	}
	if r.Limit == 0 {
		r.Limit = 100
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	out := &LeaseList{Leases: []*Lease{}}
	after := r.After
	for scanned := 0; ; scanned += listChunk {
		// One chunk per read lock, so that a listing whose filter matches
		// little (a prefix that matches nothing) never holds off Apply
		// for more than a chunk's worth of records.
		if err := n.rep.scanSlot(ctx); err != nil {
			return nil, err
		}
		n.rep.mu.RLock()
		ls, next := n.rep.f.Leases(fsm.LeaseFilter{Key: r.Key, Prefix: r.Prefix, Holder: r.Holder,
			SessionID: r.SessionID, State: fsm.State(r.State), After: after, Limit: r.Limit - len(out.Leases), Scan: listChunk})
		now := wallNow()
		for _, l := range ls {
			out.Leases = append(out.Leases, n.rep.view(l, now))
		}
		n.rep.mu.RUnlock()
		<-n.rep.scans
		out.Next = next
		if next == "" || len(out.Leases) >= r.Limit || scanned+listChunk >= listScan || ctx.Err() != nil {
			return out, nil
		}
		after = next
	}
}

// A listing looks at up to listChunk records under one read lock and at
// most listScan records in all; a page that ran out of the latter holds
// what matched so far (possibly nothing) and a cursor to go on from.
// (Variables for the tests.)
var (
	listChunk = 1024
	listScan  = 64 * 1024
)

// GetSession returns a session in any retained state.
func (n *Node) GetSession(ctx context.Context, id string, stale bool) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	s := n.rep.f.Session(id)
	if s == nil {
		return nil, fsm.Errorf(CodeSessionNotFound, "session %s not found", id)
	}
	return sessionView(s, n.rep.f.Tick(), n.rep.period(), wallNow()), nil
}

// ListSessions returns one page of sessions ordered by id.
func (n *Node) ListSessions(ctx context.Context, holder, after string, limit int, stale bool) (*SessionList, error) {
	if limit < 0 || limit > 1000 {
		return nil, fsm.InvalidField("limit", "limit must be 1-1000")
	}
	if limit == 0 {
		limit = 100
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	out := &SessionList{Sessions: []*Session{}}
	for scanned := 0; ; scanned += listChunk {
		if err := n.rep.scanSlot(ctx); err != nil {
			return nil, err
		}
		n.rep.mu.RLock()
		ss, next := n.rep.f.SessionsScan(holder, after, limit-len(out.Sessions), listChunk)
		now, tick, period := wallNow(), n.rep.f.Tick(), n.rep.period()
		for _, s := range ss {
			out.Sessions = append(out.Sessions, sessionView(s, tick, period, now))
		}
		n.rep.mu.RUnlock()
		<-n.rep.scans
		out.Next = next
		if next == "" || len(out.Sessions) >= limit || scanned+listChunk >= listScan || ctx.Err() != nil {
			return out, nil
		}
		after = next
	}
}

// Validate answers whether a fencing token (with a key) or a lease token
// (with a lease id) is valid now. It is a linearizable read.
func (n *Node) Validate(ctx context.Context, r ValidateRequest) (*ValidateResult, error) {
	byKey, byLease := r.Key != "", r.LeaseID != ""
	switch {
	case byKey == byLease:
		return nil, fsm.InvalidField("key", "give either key and fencing_token, or lease_id and token")
	case byKey && r.FencingToken == 0:
		return nil, fsm.InvalidField("fencing_token", "fencing_token is required with key")
	case byLease && r.Token == "":
		return nil, fsm.InvalidField("token", "token is required with lease_id")
	}
	if byKey {
		if err := fsm.ValidKey(r.Key); err != nil {
			return nil, err
		}
	}
	if err := n.readBarrier(ctx, false); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	now := wallNow()
	if byKey {
		active := n.rep.f.ActiveOnKey(r.Key)
		var current *Lease
		if len(active) > 0 {
			current = n.rep.view(active[len(active)-1], now)
		}
		for _, l := range active {
			if l.Fence == r.FencingToken {
				if n.rep.f.Due(l) {
					return &ValidateResult{Valid: false, Reason: string(fsm.StateExpired), Current: n.rep.view(l, now)}, nil
				}
				return &ValidateResult{Valid: true, Reason: "active", Current: n.rep.view(l, now)}, nil
			}
		}
		reason := "no_active_lease"
		switch {
		case r.FencingToken > n.rep.f.Fence():
			reason = "unknown_token"
		case len(active) > 0:
			reason = "superseded"
		}
		return &ValidateResult{Valid: false, Reason: reason, Current: current}, nil
	}
	l := n.rep.f.Lease(r.LeaseID)
	if l == nil {
		return &ValidateResult{Valid: false, Reason: "not_found"}, nil
	}
	if l.TokenHash != hashToken(r.Token) {
		return &ValidateResult{Valid: false, Reason: "token_mismatch", Current: n.rep.view(l, now)}, nil
	}
	if l.Terminal() {
		return &ValidateResult{Valid: false, Reason: string(l.State), Current: n.rep.view(l, now)}, nil
	}
	if n.rep.f.Due(l) {
		// Past its end, its expiry waiting for its chunk (fsm.FSM.Due).
		return &ValidateResult{Valid: false, Reason: string(fsm.StateExpired), Current: n.rep.view(l, now)}, nil
	}
	return &ValidateResult{Valid: true, Reason: "active", Current: n.rep.view(l, now)}, nil
}

// ClusterStatus describes the cluster as this node sees it.
//
// With stale false the read is linearizable (only the leader answers, after
// confirming its leadership), so its tick is at least every tick committed
// before the call: the chaos suite's clock checker relies on that. With
// stale true it is this node's own view, whatever its role.
func (n *Node) ClusterStatus(ctx context.Context, stale bool) (*ClusterStatus, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	r := n.cl.Raft
	st := r.Stats()
	term, _ := strconv.ParseUint(st["term"], 10, 64)
	leaderAddr, leaderID := r.LeaderWithID()
	n.rep.mu.RLock()
	tick, period := n.rep.f.Tick(), n.rep.period()
	leases, sessions := n.rep.f.Counts()
	n.rep.mu.RUnlock()
	out := &ClusterStatus{
		NodeID: n.cfg.NodeID, Leader: string(leaderID), LeaderAddr: string(leaderAddr),
		State: r.State().String(), Term: term, CommitIndex: r.CommitIndex(),
		AppliedIndex: n.rep.applied.Load(), Tick: tick, TickPeriodMS: period,
		ActiveLeases: leases, ActiveSession: sessions,
	}
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, &Error{Code: CodeInternal, Message: "read raft configuration: " + err.Error()}
	}
	out.Members = n.members(fut.Configuration(), leaderID)
	return out, nil
}

// RemoveMember removes a server from the Raft configuration. It never ends
// or shortens a lease. Only the leader can do it. The removed server is not
// re-added while it runs with the same data directory.
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	r := n.cl.Raft
	if r.State() != raft.Leader {
		return n.noLeader()
	}
	fut := r.GetConfiguration()
	if err := fut.Error(); err != nil {
		return &Error{Code: CodeInternal, Message: err.Error()}
	}
	found := false
	for _, s := range fut.Configuration().Servers {
		found = found || string(s.ID) == id
	}
	if !found {
		return &Error{Code: CodeNotFound, Message: "no member " + strconv.Quote(id)}
	}
	if id == n.cfg.NodeID && len(fut.Configuration().Servers) == 1 {
		return fsm.InvalidField("id", "cannot remove the only member of the cluster")
	}
	// Tombstone the server's data directory first: if it comes back, it is
	// not re-added (wiping its data directory lets it join anew).
	return n.removeServer(ctx, id)
}

// TransferLeadership asks the leader to hand over to id (any up-to-date
// voter when id is empty).
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	r := n.cl.Raft
	if r.State() != raft.Leader {
		return n.noLeader()
	}
	var fut raft.Future
	if id == "" {
		fut = r.LeadershipTransfer()
	} else {
		cfg := r.GetConfiguration()
		if err := cfg.Error(); err != nil {
			return &Error{Code: CodeInternal, Message: err.Error()}
		}
		var addr raft.ServerAddress
		for _, s := range cfg.Configuration().Servers {
			if string(s.ID) == id {
				addr = s.Address
			}
		}
		if addr == "" {
			return &Error{Code: CodeNotFound, Message: "no member " + strconv.Quote(id)}
		}
		fut = r.LeadershipTransferToServer(raft.ServerID(id), addr)
	}
	if err := fut.Error(); err != nil {
		return &Error{Code: fsm.CodeUnavailable, Message: "leadership transfer failed: " + err.Error()}
	}
	return nil
}

// Stats returns counters for metrics.
func (n *Node) Stats() Stats {
	n.rep.mu.RLock()
	leases, sessions := n.rep.f.Counts()
	tick := n.rep.f.Tick()
	n.rep.mu.RUnlock()
	c := n.stats
	s := Stats{
		ActiveLeases: leases, ActiveSessions: sessions,
		Acquired: c.acquired.Load(), Renewed: c.renewed.Load(), Released: c.released.Load(),
		Expired: c.expired.Load(), Revoked: c.revoked.Load(), SessionsCreated: c.sessCreated.Load(),
		SessionHeartbeats: c.sessHeartbeats.Load(), LateHeartbeats: c.lateHeartbeats.Load(),
		SessionsExpired: c.sessExpired.Load(), CommitIndex: n.cl.Raft.CommitIndex(),
		AppliedIndex: n.rep.applied.Load(), Tick: tick, IsLeader: n.cl.Raft.State() == raft.Leader,
		ApplyBuckets: applyBuckets, EventStreams: int(n.hub.streams.Load()),
	}
	c.mu.Lock()
	s.ApplyCounts = append([]uint64(nil), c.applyCount...)
	s.ApplySum, s.ApplyCount = c.applySum, c.applyN
	c.mu.Unlock()
	return s
}

// scanSlot waits for one of the slots that bound the listing chunks
// running at once; the caller gives it back with <-r.scans.
func (r *replica) scanSlot(ctx context.Context) error {
	select {
	case r.scans <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
