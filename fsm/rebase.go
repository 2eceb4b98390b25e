package fsm

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// ReasonRestore is the end reason of a lease of a restored snapshot that
// the restore did not bring back: its key (or its session) was in use when
// the snapshot was restored.
const ReasonRestore = "restore"

// RebaseStats says what Rebase did.
type RebaseStats struct {
	// DroppedWaits counts the queued acquires of the file withdrawn.
	// (The running state's are withdrawn too; the node that restores
	// fails them.)
	DroppedWaits int
	// Refenced counts the leases of the file that are active after the
	// restore, each with a new fencing token.
	Refenced int
	// Kept counts the leases live before the restore, kept as they were.
	Kept int
	// Superseded counts the leases of the file not brought back because
	// their key or session was in use before the restore (ended, revoked
	// with reason ReasonRestore).
	Superseded int
	// TickShift is how many ticks the file's clock moved forward to join
	// the running one (remaining times are kept).
	TickShift uint64
}

// Rebase readies f, a state decoded from an operator's backup, to replace
// cur, the state a running cluster has applied, as of log index index
// (node.RestoreSnapshot calls it, then hands f's snapshot to Raft). A
// restore never goes backwards:
//
//   - f continues at index (never lower than its own index): every entry
//     applied after the restore, and every event it emits, has a higher
//     index than anything before it;
//   - the clock never goes back: the tick is the later of the two, and the
//     file's deadlines move with it, so that its leases and sessions keep
//     the remaining time they had when the file was saved;
//   - what is live before the restore stays as it is: every active lease
//     and session of cur is kept, record and fencing token unchanged, and
//     a key in use in cur (an active lease or a pending lock-delay) keeps
//     cur's state, so it stays held or blocked exactly as long as it would
//     have without the restore. A lease of the file on such a key, or bound
//     to a session active in cur, is not brought back: it is ended
//     (revoked, reason ReasonRestore);
//   - every other lease the file has active is active again with a new
//     fencing token, above every token issued before the restore (so no
//     token issued before the restore is ever valid again on a lease that
//     was not live just before it), in the order of its old tokens; the
//     fencing counter is above all of them, so a lease granted after the
//     restore gets a higher token still;
//   - the member registry is cur's: like Raft's configuration, membership
//     is the cluster's as it is now, never what it was at backup time;
//     so is the cluster identity (a backup restored into another cluster
//     does not make it the backup's cluster);
//   - every queued acquire (wait_ms), the file's and cur's, is withdrawn:
//     whoever sent the file's stopped waiting long ago, and cur's are
//     failed by the node that restores.
//
// cur is only read. The decision depends on f and cur alone, so it is
// deterministic; the result is installed on every replica as a snapshot.
func (f *FSM) Rebase(cur *FSM, index uint64) int {
	return f.RebaseStats(cur, index).DroppedWaits
}

// RebaseStats is Rebase, saying what it did.
func (f *FSM) RebaseStats(cur *FSM, index uint64) RebaseStats {
	var st RebaseStats
	tick := max(f.tick, cur.tick)
	sf, sc := tick-f.tick, tick-cur.tick
	st.TickShift = sf
	wallMS := max(f.wallMS, cur.wallMS)

	// Keys in use before the restore: they keep cur's state.
	curKeys := make(map[string]bool)
	for k, ks := range cur.keys {
		live := len(ks.active()) > 0
		for _, b := range ks.blocked() {
			live = live || b.Until > cur.tick
		}
		if live {
			curKeys[k] = true
		}
	}

	// Sessions: the file's, then every session active in cur as it is.
	sessions := make(map[string]*Session, len(f.sessions))
	for id, s := range f.sessions {
		sessions[id] = shiftSession(s, sf)
	}
	curSess := make(map[string]bool)
	for id, s := range cur.sessions {
		switch {
		case s.State == SessionActive:
			sessions[id] = shiftSession(s, sc)
			curSess[id] = true
		case sessions[id] == nil:
			sessions[id] = shiftSession(s, sc) // ended, and unknown to the file
		}
	}

	// Leases: the file's, shifted; those active are brought back with a
	// new token or ended; then every lease active in cur as it is.
	leases := make(map[string]*Lease, len(f.leases)+cur.active)
	var back []*Lease
	for id, l := range f.leases {
		nl := shiftLease(l, sf)
		leases[id] = nl
		if l.State != StateActive {
			continue
		}
		if c := cur.leases[id]; c != nil && c.State == StateActive {
			continue // replaced by cur's record below
		}
		if curKeys[l.Key] || l.SessionID != "" && curSess[l.SessionID] {
			nl.State, nl.EndReason, nl.EndedTick, nl.EndedWallMS = StateRevoked, ReasonRestore, tick, wallMS
			st.Superseded++
			continue
		}
		back = append(back, nl)
	}
	slices.SortFunc(back, func(a, b *Lease) int { return cmp.Or(cmp.Compare(a.Fence, b.Fence), strings.Compare(a.ID, b.ID)) })
	fence := max(f.fence, cur.fence)
	for _, l := range back {
		fence++
		l.Fence = fence
	}
	st.Refenced = len(back)
	for id, l := range cur.leases {
		switch {
		case l.State == StateActive:
			leases[id] = shiftLease(l, sc)
			st.Kept++
		case leases[id] == nil:
			// Ended before the restore and unknown to the file: it stays
			// ended (a renew says so) until it is pruned.
			leases[id] = shiftLease(l, sc)
		}
	}

	// A session of the file keeps only the leases brought back.
	for id, s := range sessions {
		if curSess[id] || s.State != SessionActive || len(s.LeaseIDs) == 0 {
			continue
		}
		ids := slices.DeleteFunc(slices.Clone(s.LeaseIDs), func(lid string) bool {
			l := leases[lid]
			return l == nil || l.State != StateActive
		})
		if len(ids) != len(s.LeaseIDs) {
			ns := *s
			ns.LeaseIDs = ids
			sessions[id] = &ns
		}
	}

	// Keys: cur's for those in use before, the file's for the others; no
	// waiters; stolen ids only of leases still there.
	keys := make(map[string]*keyState, len(f.keys)+len(curKeys))
	for k, ks := range f.keys {
		if !curKeys[k] {
			keys[k] = copyKey(ks, sf, f.tick, &st.DroppedWaits)
		} else {
			st.DroppedWaits += ks.nWaiters()
		}
	}
	var curWaits int // failed by the node that restores
	for k := range curKeys {
		keys[k] = copyKey(cur.keys[k], sc, cur.tick, &curWaits)
	}
	activeOn := make(map[string]bool)
	for _, l := range leases {
		if l.State == StateActive {
			activeOn[l.Key] = true
		}
	}
	recs := make([]keyRec, 0, len(keys))
	for k, ks := range keys {
		if m := ks.more; m != nil {
			m.stolen = slices.DeleteFunc(m.stolen, func(id string) bool {
				l := leases[id]
				return l == nil || l.State == StateActive
			})
			ks.tidy()
		}
		if !activeOn[k] && ks.more == nil {
			continue // nothing left on the key
		}
		recs = append(recs, keyRec{key: k, ks: ks})
	}
	slices.SortFunc(recs, func(a, b keyRec) int { return strings.Compare(a.key, b.key) })

	n := New()
	n.index, n.tick, n.periodMS, n.wallMS, n.fence = max(f.index, index), tick, cmp.Or(f.periodMS, cur.periodMS), wallMS, fence
	for _, r := range recs {
		n.keys[r.key] = r.ks
	}
	n.sessions = sessions
	sortedSessions := make([]*Session, 0, len(sessions))
	for _, id := range sortedKeys(sessions) {
		sortedSessions = append(sortedSessions, sessions[id])
	}
	sortedLeases := make([]*Lease, 0, len(leases))
	for _, id := range sortedKeys(leases) {
		sortedLeases = append(sortedLeases, leases[id])
	}
	if err := n.rebuild(recs, sortedSessions, sortedLeases); err != nil {
		// Every active lease is on a key of recs, by construction.
		panic("fsm: rebase: " + err.Error())
	}
	n.members = maps.Clone(cur.members)
	if n.members == nil {
		n.members = make(map[string]MemberRecord)
	}
	// Only what the rebase rebuilt is replaced: any other part of the
	// state stays f's.
	f.index, f.tick, f.periodMS, f.wallMS, f.fence = n.index, n.tick, n.periodMS, n.wallMS, n.fence
	f.leases, f.sessions, f.keys, f.idem, f.waiting = n.leases, n.sessions, n.keys, n.idem, n.waiting
	f.order, f.sessIDs, f.holders, f.buckets, f.prune = n.order, n.sessIDs, n.holders, n.buckets, n.prune
	f.backlog = n.backlog
	f.members, f.active, f.sessOpen = n.members, n.active, n.sessOpen
	f.holderWaits, f.keyIdx = n.holderWaits, n.keyIdx
	f.clusterID, f.sealCheck = cur.clusterID, cur.sealCheck
	f.events, f.notices = f.events[:0], nil
	return st
}

// copyKey copies a key's limit, pending lock-delays (moved by shift ticks;
// those already over at tick now are left out) and stolen ids, without its
// active ids (rebuild adds them) and waiters (counted in dropped).
func copyKey(ks *keyState, shift, now uint64, dropped *int) *keyState {
	n := &keyState{limit: ks.limit}
	m := ks.more
	if m == nil {
		return n
	}
	*dropped += m.waitq.len()
	var bl []blocked
	for _, b := range m.blocked {
		if b.Until > now {
			bl = append(bl, blocked{Until: b.Until + shift, LeaseID: b.LeaseID})
		}
	}
	if len(bl) > 0 || len(m.stolen) > 0 {
		n.more = &keyMore{blocked: bl, stolen: slices.Clone(m.stolen)}
	}
	return n
}

func shiftLease(l *Lease, d uint64) *Lease {
	nl := *l
	if d == 0 {
		return &nl
	}
	if nl.ExpiresTick != 0 {
		nl.ExpiresTick += d
	}
	nl.AcquiredTick += d
	if nl.EndedTick != 0 || nl.State != StateActive {
		nl.EndedTick += d
	}
	return &nl
}

func shiftSession(s *Session, d uint64) *Session {
	ns := *s
	if d == 0 {
		return &ns
	}
	ns.ExpiresTick += d
	if ns.State != SessionActive {
		ns.EndedTick += d
	}
	return &ns
}
