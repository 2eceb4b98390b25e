package node

import (
	"context"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// readBarrier makes a linearizable read possible: this node confirms it is
// still the leader (a quorum answered after the read began) and waits until
// it has applied everything committed before that moment. A stale read
// skips it and answers from whatever this node has applied. A server out
// of service (Gate: removed, diverged, damaged, frozen) serves no read at
// all, stale or not: its state is not the cluster's.
func (n *Node) readBarrier(ctx context.Context, stale bool) error {
	if err := n.Gate(); err != nil {
		return err
	}
	if stale || canaryStaleRead {
		return nil
	}
	// Ready in the term this server leads in now (isLeaderReady), both
	// before the commit index is read and after a quorum confirmed the
	// leadership: leader in that one term throughout, so the commit index
	// covers every write acknowledged before the read began.
	p := n.lt.readyTerm()
	if p == nil {
		return n.noLeader()
	}
	commit, err := n.cl.ReadIndex(p.term)
	if err != nil || p.ctx.Err() != nil {
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
	if _, id := n.cl.Leader(); string(id) == n.cfg.NodeID {
		msg = "this node was just elected leader and is still applying its predecessors' entries; retry shortly"
	} else if addr, id := n.cl.Leader(); addr != "" {
		msg = "this node is not the leader; the leader is " + string(id) + " at " + string(addr)
	}
	return &wire.Error{Code: wire.CodeNoLeader, Message: msg}
}

// GetLease returns a lease in any retained state.
func (n *Node) GetLease(ctx context.Context, id string, stale bool) (*wire.Lease, error) {
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
		return nil, fsm.Errorf(wire.CodeLeaseNotFound, "lease %s not found", id)
	}
	return n.rep.view(l, wallNow()), nil
}

// ListLeases returns one page of leases ordered by id.
func (n *Node) ListLeases(ctx context.Context, r wire.ListRequest, stale bool) (*wire.LeaseList, error) {
	state, _ := fsm.ParseState(r.State)
	switch {
	case r.State == "", state == fsm.StateActive, state == fsm.StateReleased, state == fsm.StateExpired, state == fsm.StateRevoked:
	default:
		return nil, fsm.InvalidField("state", "state must be active, released, expired or revoked")
	}
	if r.Limit < 0 || r.Limit > 1000 {
		return nil, wire.OutOfRange("limit", 1, 1000, int64(r.Limit), "")
	}
	if r.Limit == 0 {
		r.Limit = 100
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	out := &wire.LeaseList{Leases: []*wire.Lease{}}
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
			SessionID: r.SessionID, State: state, After: after, Limit: r.Limit - len(out.Leases), Scan: listChunk})
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
func (n *Node) GetSession(ctx context.Context, id string, stale bool) (*wire.Session, error) {
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
		return nil, fsm.Errorf(wire.CodeSessionNotFound, "session %s not found", id)
	}
	return sessionView(s, n.rep.f.Tick(), n.rep.period(), wallNow()), nil
}

// ListSessions returns one page of sessions ordered by id.
func (n *Node) ListSessions(ctx context.Context, holder, after string, limit int, stale bool) (*wire.SessionList, error) {
	if limit < 0 || limit > 1000 {
		return nil, wire.OutOfRange("limit", 1, 1000, int64(limit), "")
	}
	if limit == 0 {
		limit = 100
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	out := &wire.SessionList{Sessions: []*wire.Session{}}
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
func (n *Node) Validate(ctx context.Context, r wire.ValidateRequest) (*wire.ValidateResult, error) {
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
		var current *wire.Lease
		if len(active) > 0 {
			current = n.rep.view(active[len(active)-1], now)
		}
		for _, l := range active {
			if l.Fence == r.FencingToken {
				if n.rep.f.Due(l) {
					return &wire.ValidateResult{Valid: false, Reason: fsm.StateExpired.String(), Current: n.rep.view(l, now)}, nil
				}
				return &wire.ValidateResult{Valid: true, Reason: "active", Current: n.rep.view(l, now)}, nil
			}
		}
		reason := "no_active_lease"
		switch {
		case r.FencingToken > n.rep.f.Fence():
			reason = "unknown_token"
		case len(active) > 0:
			reason = "superseded"
		}
		return &wire.ValidateResult{Valid: false, Reason: reason, Current: current}, nil
	}
	l := n.rep.f.Lease(r.LeaseID)
	if l == nil {
		return &wire.ValidateResult{Valid: false, Reason: "not_found"}, nil
	}
	if l.TokenHash != hashToken(r.Token) {
		return &wire.ValidateResult{Valid: false, Reason: "token_mismatch", Current: n.rep.view(l, now)}, nil
	}
	if l.Terminal() {
		return &wire.ValidateResult{Valid: false, Reason: l.State.String(), Current: n.rep.view(l, now)}, nil
	}
	if n.rep.f.Due(l) {
		// Past its end, its expiry waiting for its chunk (fsm.FSM.Due).
		return &wire.ValidateResult{Valid: false, Reason: fsm.StateExpired.String(), Current: n.rep.view(l, now)}, nil
	}
	return &wire.ValidateResult{Valid: true, Reason: "active", Current: n.rep.view(l, now)}, nil
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
		SessionsExpired: c.sessExpired.Load(), CommitIndex: n.cl.CommitIndex(),
		AppliedIndex: n.rep.applied.Load(), Tick: tick, IsLeader: n.cl.IsLeader(),
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
