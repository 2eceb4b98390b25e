package fsm

import (
	"maps"
	"slices"

	"github.com/leasehold/leasehold/wire"
)

// sessionBook owns the sessions: their records, the listing index and the
// count of active ones. Ending a session ends its leases through the
// leaseBook (lb), which also keeps each holder's sessions.
type sessionBook struct {
	*core
	lb  *leaseBook
	exp *expiry

	sessions map[string]*Session
	sessIDs  idIndex // session ids, for ordered listing
	sessOpen int     // active sessions
}

func (sb *sessionBook) sessionCreate(c *SessionCreate) Result {
	if err := validID("session_id", c.SessionID); err != nil {
		return Result{Err: err}
	}
	if err := ValidHolder(c.Holder); err != nil {
		return Result{Err: err}
	}
	if c.TTLTicks == 0 || c.TTLMS <= 0 || c.TTLTicks > MaxTicks {
		return Result{Err: InvalidField("ttl_ms", "a session needs a positive ttl")}
	}
	if c.TokenHash.IsZero() {
		return Result{Err: InvalidField("token", "missing token hash")}
	}
	if err := ValidMetadata(c.Metadata); err != nil {
		return Result{Err: err}
	}
	if _, dup := sb.sessions[c.SessionID]; dup {
		return Result{Err: InvalidField("session_id", "session id %s already exists", c.SessionID)}
	}
	if q := c.Quota.Sessions; q > 0 && uint64(sb.sessOpen) >= q {
		return Result{Err: Exhausted("sessions", q, "the cluster has %d active sessions, its limit", sb.sessOpen)}
	}
	if hi := sb.lb.holders[c.Holder]; c.Quota.HolderSessions > 0 && hi != nil && uint64(hi.sessions.n) >= c.Quota.HolderSessions {
		return Result{Err: Exhausted("sessions_per_holder", c.Quota.HolderSessions,
			"holder %s has %d active sessions, its limit", quote(c.Holder), hi.sessions.n)}
	}
	s := &Session{
		ID: c.SessionID, Holder: c.Holder, State: SessionActive, TokenHash: c.TokenHash,
		TTLMS: c.TTLMS, TTLTicks: c.TTLTicks, ExpiresTick: sb.tick + c.TTLTicks,
		CreatedWallMS: c.WallMS, LastHeartbeat: c.WallMS, Metadata: c.Metadata,
	}
	sb.sessions[s.ID] = s
	sb.sessIDs.insert(s.ID)
	sb.sessOpen++
	sb.lb.holder(s.Holder).sessions.insert(s.ID)
	sb.exp.schedule(s.ExpiresTick+GraceTicks, kindSession, s.ID)
	sb.emit(Event{Type: EventSessionCreated, WallMS: c.WallMS, Session: s})
	return Result{Session: s}
}

func (sb *sessionBook) sessionHeartbeat(c *SessionHeartbeat) Result {
	if err := validID("session_id", c.SessionID); err != nil {
		return Result{Err: err}
	}
	s, err := sb.checkSession(c.SessionID, c.TokenHash)
	if err != nil {
		return Result{Err: err}
	}
	if c.SetMetadata {
		if err := ValidMetadata(c.Metadata); err != nil {
			return Result{Err: err}
		}
	}
	ns := *s
	if c.SetMetadata {
		ns.Metadata = maps.Clone(nilIfEmpty(c.Metadata)) // not the command's map: an embedder's request may hold it
	}
	if end := sb.tick + ns.TTLTicks; end > ns.ExpiresTick {
		ns.ExpiresTick = end // the session's timer moves when it comes due (applyTick)
	}
	ns.LastHeartbeat = c.WallMS
	if ns.HeartbeatCount < ^uint64(0) {
		ns.HeartbeatCount++
	}
	sb.sessions[s.ID] = &ns
	sb.emit(Event{Type: EventSessionHeartbeat, WallMS: c.WallMS, Session: &ns})
	return Result{Session: &ns}
}

func (sb *sessionBook) sessionEnd(c *SessionEnd) Result {
	if err := validID("session_id", c.SessionID); err != nil {
		return Result{Err: err}
	}
	s := sb.sessions[c.SessionID]
	if s == nil {
		return Result{Err: Errorf(wire.CodeSessionNotFound, "session %s not found", c.SessionID)}
	}
	if !c.Force && s.TokenHash != c.TokenHash {
		return Result{Err: Errorf(wire.CodeLeaseTokenInvalid, "session token does not match session %s", c.SessionID)}
	}
	if s.State != SessionActive {
		return Result{Err: Errorf(wire.CodeSessionEnded, "session %s has %s", c.SessionID, s.State)}
	}
	if s.ExpiresTick+GraceTicks <= sb.tick {
		// Due, its expiry still in the backlog (expire.go): it has
		// expired as far as its holder can tell.
		return Result{Err: Errorf(wire.CodeSessionEnded, "session %s has expired", c.SessionID)}
	}
	return Result{Session: sb.endSession(s, SessionEnded, "ended", c.WallMS)}
}

// bind checks the session an acquire names (id "" for none) and returns it
// with the holder of the acquire's leases: the session's, which a holder
// the acquire names too must match.
func (sb *sessionBook) bind(id string, tok Hash, holder string) (*Session, string, *wire.Error) {
	if id == "" {
		return nil, holder, nil
	}
	s, err := sb.checkSession(id, tok)
	if err != nil {
		return nil, "", err
	}
	if holder != "" && holder != s.Holder {
		return nil, "", InvalidField("holder", "holder %q differs from the session's holder %q", holder, s.Holder)
	}
	return s, s.Holder, nil
}

// endSession ends a session and every lease bound to it: released when the
// session was ended on purpose, expired (with lock-delay) when it timed out.
func (sb *sessionBook) endSession(s *Session, state State, reason string, wallMS int64) *Session {
	ns, _ := sb.endSessionN(s, state, reason, wallMS, 0, false)
	return ns
}

// endSessionN is endSession ending at most limit records (the session
// counts as one; 0: no limit): the leases beyond it stay active, bound to
// the ended session, with their timers in the backlog (expire.go). It
// returns the session and the number of records it ended.
func (sb *sessionBook) endSessionN(s *Session, state State, reason string, wallMS int64, limit uint64, midTick bool) (*Session, uint64) {
	ns := *s
	ns.State = state
	ns.EndReason = reason
	ns.EndedTick = sb.tick
	ns.EndedWallMS = wallMS
	ns.LeaseIDs = slices.Clone(s.LeaseIDs)
	sb.sessions[s.ID] = &ns
	sb.sessOpen--
	if hi := sb.lb.holders[s.Holder]; hi != nil {
		hi.sessions.remove(s.ID)
	}
	o := endOpts{state: StateReleased, reason: ReasonSessionEnded, wallMS: wallMS, session: true}
	if state == SessionExpired {
		o.state, o.delay, o.midTick = StateExpired, true, midTick
	}
	n := uint64(1)
	var rest []string
	for k, id := range ns.LeaseIDs {
		if limit > 0 && n >= limit {
			// The rest wait in the backlog without being looked up here:
			// a timer whose lease is no longer active ends nothing when
			// its turn comes (fire), so the same leases end in the same
			// entries as when only the active ones were deferred.
			rest = ns.LeaseIDs[k:]
			break
		}
		if l := sb.lb.Lease(id); l != nil && l.State == StateActive {
			sb.lb.end(l, o)
			n++
		}
	}
	sb.lb.dropHolder(s.Holder)
	sb.exp.ended(kindSession, s.ID)
	sb.emit(Event{Type: EventSessionEnded, WallMS: wallMS, Session: &ns, Reason: reason})
	if len(rest) > 0 {
		sb.exp.deferLeases(rest)
	}
	return &ns, n
}

// current is the stored version of session s (a grant stores a new one),
// nil for nil.
func (sb *sessionBook) current(s *Session) *Session {
	if s == nil {
		return nil
	}
	return sb.sessions[s.ID]
}

// leaseEnd is the nominal end tick of an active lease (its session's for a
// bound lease).
func (sb *sessionBook) leaseEnd(l *Lease) uint64 {
	if l.SessionID != "" {
		if s := sb.sessions[l.SessionID]; s != nil {
			return s.ExpiresTick
		}
	}
	return l.ExpiresTick
}

func (sb *sessionBook) checkSession(id string, tok Hash) (*Session, *wire.Error) {
	s := sb.sessions[id]
	if s == nil {
		return nil, Errorf(wire.CodeSessionNotFound, "session %s not found", id)
	}
	if s.TokenHash != tok {
		return nil, Errorf(wire.CodeLeaseTokenInvalid, "session token does not match session %s", id)
	}
	if s.State != SessionActive {
		return nil, Errorf(wire.CodeSessionEnded, "session %s has %s", id, s.State)
	}
	if s.ExpiresTick+GraceTicks <= sb.tick {
		// Due to expire at this very tick (its timer has not run yet):
		// nothing may be granted to it any more.
		return nil, Errorf(wire.CodeSessionEnded, "session %s has expired", id)
	}
	return s, nil
}

// pruneSession forgets ended session id.
func (sb *sessionBook) pruneSession(id string) {
	if s := sb.sessions[id]; s != nil && s.State != SessionActive {
		delete(sb.sessions, id)
		sb.sessIDs.remove(id)
	}
}

// bindLease records that session sess (its stored version) holds the new
// lease id.
func (sb *sessionBook) bindLease(sess *Session, id string) {
	ns := *sess
	// Appending in place is copy-on-write too: only the stored (latest)
	// version is ever appended to, and an older one reads nothing past
	// its own length; copying on every grant would make binding n leases
	// O(n²).
	ns.LeaseIDs = append(sess.LeaseIDs, id)
	sb.sessions[sess.ID] = &ns
}

// unbindLease forgets lease id, which ended on its own, from the leases of
// session sid while the session is active.
func (sb *sessionBook) unbindLease(sid, id string) {
	if s := sb.sessions[sid]; s != nil && s.State == SessionActive {
		ns := *s
		ns.LeaseIDs = withoutID(s.LeaseIDs, id)
		sb.sessions[s.ID] = &ns
	}
}
