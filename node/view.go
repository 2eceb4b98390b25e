package node

import (
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func wallTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func optTime(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := wallTime(ms)
	return &t
}

// remaining converts the ticks left before end into milliseconds.
func remaining(end, tick uint64, period int64) int64 {
	if end <= tick {
		return 0
	}
	return int64(end-tick) * period
}

// leaseView renders a record in state (its own, or expired for a due
// lease: fsm.FSM.ReadState). endTick and ttlMS are the lease's own for a
// standalone lease and its session's for a bound one; now is the moment
// the countdown is displayed from.
func leaseView(l *fsm.Lease, state fsm.State, endTick uint64, ttlMS int64, tick uint64, period int64, now time.Time) *wire.Lease {
	// One allocation for the view and its optional times, filled in place
	// (a composite literal would be built aside and copied in).
	a := &struct {
		v              wire.Lease
		renewed, ended time.Time
	}{}
	v := &a.v
	v.LeaseID, v.Key, v.Holder, v.Limit, v.SessionID, v.GroupID = l.ID, l.Key, l.Holder, uint32(l.Limit), l.SessionID, l.GroupID()
	v.State, v.FencingToken, v.TTLMS = state.String(), l.Fence, ttlMS
	v.AcquiredAt, v.HeartbeatIntervalMS = wallTime(l.AcquiredWallMS), ttlMS/3
	v.RenewalCount, v.Metadata, v.EndReason = l.RenewalCount, l.Metadata(), l.EndReason()
	if ms := l.RenewedWallMS; ms != 0 {
		a.renewed = wallTime(ms)
		v.LastRenewedAt = &a.renewed
	}
	if ms := l.EndedWallMS(); ms != 0 {
		a.ended = wallTime(ms)
		v.EndedAt = &a.ended
	}
	switch {
	case state == fsm.StateActive:
		v.RemainingMS = remaining(endTick, tick, period)
		// now + remaining, to the millisecond below, in UTC: the
		// remaining time is whole milliseconds.
		v.ExpiresAt = wallTime(now.UnixMilli() + v.RemainingMS)
	case v.EndedAt != nil:
		v.ExpiresAt = *v.EndedAt
	case l.State == fsm.StateActive:
		// Due: ended as far as anyone can tell, its expiry not applied
		// yet (no ended_at): nothing remains.
		v.ExpiresAt = wallTime(now.UnixMilli())
	}
	return v
}

func sessionView(s *fsm.Session, tick uint64, period int64, now time.Time) *wire.Session {
	v := &wire.Session{
		SessionID: s.ID, Holder: s.Holder, State: s.State.String(), TTLMS: s.TTLMS,
		HeartbeatIntervalMS: s.TTLMS / 3, LastHeartbeat: optTime(s.LastHeartbeat),
		HeartbeatCount: s.HeartbeatCount, CreatedAt: wallTime(s.CreatedWallMS),
		EndedAt: optTime(s.EndedWallMS), EndReason: s.EndReason, Metadata: s.Metadata,
		LeaseIDs: s.LeaseIDs,
	}
	if v.LeaseIDs == nil {
		v.LeaseIDs = []string{}
	}
	if s.State == fsm.SessionActive {
		v.RemainingMS = remaining(s.ExpiresTick, tick, period)
		v.ExpiresAt = now.Add(time.Duration(v.RemainingMS) * time.Millisecond).UTC().Truncate(time.Millisecond)
	} else if v.EndedAt != nil {
		v.ExpiresAt = *v.EndedAt
	}
	return v
}

// renderEvent turns an applied event into the contract's event object; its
// countdowns are as of the event's own tick.
func renderEvent(e *hubEvent) wire.Event {
	at := wallTime(e.WallMS)
	ev := wire.Event{
		ID: eventID{e.Index, e.Seq}.String(), Index: e.Index, Type: string(e.Type), Tick: e.Tick,
		Time: at, Key: e.Key, Reason: e.Reason, Previous: e.Previous,
	}
	if e.Lease != nil {
		ev.Lease = leaseView(e.Lease, e.Lease.State, e.endTick, e.ttlMS, e.Tick, e.period, at)
	}
	if e.Session != nil {
		ev.Session = sessionView(e.Session, e.Tick, e.period, at)
	}
	return ev
}

// view renders a lease against the current state, through the state
// machine's due check (a due lease reads as expired); the caller holds
// r.mu.
func (r *replica) view(l *fsm.Lease, now time.Time) *wire.Lease {
	end, ttl := l.ExpiresTick, l.TTLMS
	if l.SessionID != "" {
		if s := r.f.Session(l.SessionID); s != nil {
			end, ttl = s.ExpiresTick, s.TTLMS
		}
	}
	return leaseView(l, r.f.ReadState(l), end, ttl, r.f.Tick(), r.period(), now)
}

// period is the cluster's tick period, or this node's configured one before
// the first tick has fixed it.
func (r *replica) period() int64 {
	if p := r.f.PeriodMS(); p > 0 {
		return p
	}
	return r.defaultPeriod
}
