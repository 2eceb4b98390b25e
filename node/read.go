package node

import (
	"cmp"
	"context"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
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
	r.Limit = cmp.Or(r.Limit, 100)
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
	limit = cmp.Or(limit, 100)
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

// GrantKeys returns the cluster's key set (GET /v1/keys): every server's
// current grant signing key and the keys retired less than
// Config.GrantKeyRetention ago (by the cluster clock), each once. Linearizable
// unless stale.
func (n *Node) GrantKeys(ctx context.Context, stale bool) (*grant.KeySet, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	members := n.rep.f.Members()
	tick, period, cid := n.rep.f.Tick(), n.rep.period(), n.rep.f.ClusterID()
	n.rep.mu.RUnlock()
	ks := &grant.KeySet{ClusterID: cid, Keys: []grant.JWK{}}
	seen := map[string]bool{}
	add := func(k fsm.GrantKey, server string, retired *time.Time) {
		jwk := grant.PublicJWK(k[:])
		if seen[jwk.Kid] {
			return
		}
		seen[jwk.Kid] = true
		jwk.ServerID, jwk.RetiredAt = server, retired
		ks.Keys = append(ks.Keys, jwk)
	}
	// Current keys first, so that a key some server still signs with is
	// never listed as retired.
	for _, m := range members {
		if m.GrantKeys != nil && !m.GrantKeys.Current.IsZero() {
			add(m.GrantKeys.Current, m.ID, nil)
		}
	}
	now := wallNow()
	for _, m := range members {
		if m.GrantKeys == nil {
			continue
		}
		for _, r := range m.GrantKeys.Retired {
			age := time.Duration(tick-min(r.Tick, tick)) * time.Duration(period) * time.Millisecond
			if age >= n.cfg.GrantKeyRetention {
				continue
			}
			at := now.Add(-age).UTC().Truncate(time.Second)
			add(r.Key, m.ID, &at)
		}
	}
	return ks, nil
}

// LeaseGrant returns lease r.LeaseID, as GetLease does, with a grant signed
// by this server, to its holder: r.Token must be the lease's token (or,
// for a lease bound to a session, r.SessionToken the session's). Only an
// active lease gets a grant; an ended one is refused with its state's code
// (LEASE_EXPIRED, LEASE_RELEASED, LEASE_REVOKED). Linearizable unless
// stale (a stale grant states what this server has applied).
func (n *Node) LeaseGrant(ctx context.Context, r wire.GrantRequest, stale bool) (*wire.Lease, error) {
	if err := checkID("lease", r.LeaseID); err != nil {
		return nil, err
	}
	if r.Token == "" && r.SessionToken == "" {
		return nil, fsm.InvalidField("token", "a grant is given to the lease's holder: the lease token (X-Lease-Token) or, for a bound lease, the session token is required")
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	if err := n.gk.usable(); err != nil {
		return nil, err
	}
	now := wallNow()
	n.rep.mu.RLock()
	l := n.rep.f.Lease(r.LeaseID)
	var v *wire.Lease
	ok := false
	if l != nil {
		ok = r.Token != "" && hashToken(r.Token) == l.TokenHash
		if !ok && r.SessionToken != "" && l.SessionID != "" {
			s := n.rep.f.Session(l.SessionID)
			ok = s != nil && hashToken(r.SessionToken) == s.TokenHash
		}
		v = n.rep.view(l, now)
	}
	n.rep.mu.RUnlock()
	switch {
	case l == nil:
		return nil, fsm.Errorf(wire.CodeLeaseNotFound, "lease %s not found", r.LeaseID)
	case !ok:
		return nil, fsm.Errorf(wire.CodeLeaseTokenInvalid, "wrong lease token for lease %s", r.LeaseID)
	case v.State != fsm.StateActive.String():
		return nil, fsm.Errorf(endedCode(v.State), "lease %s is %s: a grant is given for an active lease only", r.LeaseID, v.State)
	}
	v.Grant = n.gk.sign(v, now)
	return v, nil
}

// Subscribe starts a subscription. It fails with EVENTS_COMPACTED when the
// requested resume point is older than the history this node keeps, and
// with INVALID_ARGUMENT on a malformed resume id, and with
// RESOURCE_EXHAUSTED (field "event_streams") when Config.MaxEventStreams
// subscriptions are open on this node.
func (n *Node) Subscribe(ctx context.Context, f wire.EventFilter) (*Subscription, error) {
	if err := n.Gate(); err != nil {
		return nil, err
	}
	h := n.hub
	var pos uint64
	var after eventID // events up to this id are never delivered
	switch {
	case f.After != "":
		id, ok := parseEventID(f.After)
		if !ok {
			return nil, fsm.InvalidField("after", "malformed event id %q (want <index>-<seq>)", f.After)
		}
		p, err := h.position(id)
		if err != nil {
			return nil, err
		}
		pos, after = p, id
	case f.AfterIndex > 0:
		after = eventID{index: f.AfterIndex, seq: ^uint32(0)}
		p, err := h.position(after)
		if err != nil {
			return nil, err
		}
		pos = p
	case f.FromStart:
		// Whatever history is kept, from its oldest event.
		h.mu.Lock()
		pos = h.start
		h.mu.Unlock()
	default:
		h.mu.Lock()
		pos = h.end
		h.mu.Unlock()
	}
	if open := h.streams.Add(1); n.cfg.MaxEventStreams > 0 && open > int64(n.cfg.MaxEventStreams) {
		h.streams.Add(-1)
		return nil, fsm.Exhausted("event_streams", uint64(n.cfg.MaxEventStreams),
			"this node has %d event streams open, its limit", n.cfg.MaxEventStreams)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscription{ch: make(chan wire.Event, 256), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer h.streams.Add(-1)
		defer close(s.done)
		defer close(s.ch)
		s.run(ctx, n.hub, n.Gate, n.sc.out.ch, pos, after, f)
	}()
	return s, nil
}

// LocalState is one node's own view, never forwarded: what a convergence
// check compares across the nodes of a cluster.
type LocalState struct {
	NodeID string `json:"node_id"`
	// State is the Raft state: Leader, Follower, Candidate, Shutdown.
	State string `json:"state"`
	Term  uint64 `json:"term"`
	// Leader is the id of the leader this node knows of, "" for none.
	Leader       string `json:"leader"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	// LastIndex is the last index in this node's log (or its latest
	// snapshot's): past CommitIndex, entries not known committed, which a
	// deposed leader's log may have to give up.
	LastIndex uint64 `json:"last_index"`
	// Tick is the last tick applied here.
	Tick uint64 `json:"tick"`
	// FenceHigh is the highest fencing token the cluster has issued, as
	// applied here (the state's fencing counter): the fence floor to give
	// a restore of this cluster's backup into another cluster (a disaster
	// recovery, a rollback), so that no token issued here is issued again
	// there. Read it from the leader, or the most advanced survivor.
	FenceHigh uint64 `json:"fence_high"`
	// SnapshotsInstalled counts the snapshots this node installed from a
	// leader since it started; SnapshotsRestored counts every state
	// replaced since it started (those installs and operator restores).
	SnapshotsInstalled uint64 `json:"snapshots_installed"`
	SnapshotsRestored  uint64 `json:"snapshots_restored"`
	// StateHash, set when a hash was asked for, is the hex SHA-256 of the
	// whole replicated state right after this node applied the entry at
	// HashIndex: of the state's snapshot encoding, which is canonical
	// (equal states give equal bytes; fsm/DESIGN.md). Replicas that applied
	// the same log have the same hash at the same index. HashTick is the
	// state's tick then.
	StateHash string `json:"state_hash,omitempty"`
	HashIndex uint64 `json:"hash_index,omitempty"`
	HashTick  uint64 `json:"hash_tick,omitempty"`
}

// LocalState returns this node's view. With hashAt > 0 it also returns the
// hash of the state right after the entry at index hashAt is applied: it
// waits for that entry (until ctx ends: UNAVAILABLE, with the applied index),
// and answers INDEX_PASSED when this node is already past it. The state is
// captured in the apply path right after that entry and encoded and hashed
// outside it, as a snapshot is; nothing happens in the apply path when no
// hash is pending.
//
// A leader appends tick entries continuously, so hashes "now" are never
// comparable across nodes; hashes at the same future index are.
func (n *Node) LocalState(ctx context.Context, hashAt uint64) (*LocalState, error) {
	var h *stateHash
	if hashAt > 0 {
		var err error
		if h, err = n.rep.hashAt(ctx, hashAt); err != nil {
			return nil, err
		}
	}
	r := n.cl
	_, leader := r.Leader()
	n.rep.mu.RLock()
	tick, fence := n.rep.f.Tick(), n.rep.f.Fence()
	n.rep.mu.RUnlock()
	st := &LocalState{FenceHigh: fence,
		NodeID: n.cfg.NodeID, State: string(r.State()), Term: r.Term(), Leader: string(leader),
		CommitIndex: r.CommitIndex(), AppliedIndex: n.rep.applied.Load(), LastIndex: r.LastIndex(), Tick: tick,
		SnapshotsInstalled: n.rep.installed.Load(), SnapshotsRestored: n.rep.restores.Load(),
	}
	if h != nil {
		st.StateHash, st.HashIndex, st.HashTick = h.sum, h.index, h.tick
		// The hash is taken in the apply path, in the middle of a batch
		// whose last index is stored once the whole batch has applied.
		st.AppliedIndex = max(st.AppliedIndex, h.index)
	}
	return st, nil
}
