package fsm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// rebuilder builds a new state machine from the records of a snapshot
// (snapshot_binary.go, snapshot_v1.go) or of a rebase (rebase.go): it
// enters the records and derives every index (buckets, the backlog,
// holders, idempotency, prune queue, id indexes, groups) that snapshots
// never store. It holds the state machine it builds, which nobody else
// sees until it is complete.
type rebuilder struct{ *FSM }

// rebuild derives every index from the records of a snapshot, each group
// sorted by key or id without duplicates. The keys and sessions are already
// in their maps. kss, when not nil, is the state of each lease's key (nil
// for a key without one), which rebuild otherwise looks up.
func (n rebuilder) rebuild(keys []keyRec, sessions []*Session, leases []*Lease, kss []*keyState) error {
	if err := checkWaiters(keys); err != nil {
		return err
	}
	n.leases.reserve(len(leases))
	ended, keyless, err := n.rebuildLeases(leases, kss, nil, nil)
	if err != nil {
		return err
	}
	return n.rebuildRest(keys, sessions, leases, ended, keyless)
}

// rebuildRest is rebuild after rebuildLeases: leases are all the leases,
// ended and keyless what rebuildLeases returned for them.
func (n rebuilder) rebuildRest(keys []keyRec, sessions []*Session, leases []*Lease, ended []pruneItem, keyless []string) error {
	n.order.fromSorted(len(leases), func(i int) string { return leases[i].ID })
	n.keyIdx.fromSorted(countKeys(keys, keyless))
	ended = n.rebuildSessions(sessions, ended)
	n.sessIDs.fromSorted(len(sessions), func(i int) string { return sessions[i].ID })
	for h, hi := range n.holders {
		if hi.leases.n == 0 && hi.sessions.n == 0 {
			delete(n.holders, h) // interned for a record that has ended
		}
	}
	n.rebuildKeys(keys)
	if err := n.rebuildGroups(keys, leases); err != nil {
		return err
	}
	slices.SortFunc(ended, func(a, b pruneItem) int {
		return cmp.Or(cmp.Compare(a.tick, b.tick), cmp.Compare(a.kind, b.kind), strings.Compare(a.id, b.id))
	})
	n.prune = ended
	// Whatever a limited tick left due (schedule puts it in the backlog)
	// is processed in the order the replica that applied the tick has it.
	sortTimers(n.backlog)
	return nil
}

// checkWaiters refuses a waiter without a command and a lease id queued
// twice.
func checkWaiters(keys []keyRec) error {
	seen := make(map[string]bool)
	for i, k := range keys {
		for _, w := range k.waiters {
			if w.Cmd == nil {
				return fmt.Errorf("fsm: snapshot key %d: waiter without a command", i)
			}
			if w.Cmd.Limit < 1 || w.Cmd.Limit > MaxLimit {
				// grant stores a lease's limit in 16 bits: it takes a
				// validated acquire, and so must a restored one.
				return fmt.Errorf("fsm: snapshot key %d: waiter %s with limit %d, not 1-%d", i, w.Cmd.LeaseID, w.Cmd.Limit, MaxLimit)
			}
			if seen[w.Cmd.LeaseID] {
				return fmt.Errorf("fsm: snapshot key %d: lease id %s queued twice", i, w.Cmd.LeaseID)
			}
			seen[w.Cmd.LeaseID] = true
		}
	}
	return nil
}

// rebuildLeases enters the leases in the lease map, the idempotency map,
// their keys' refs and active sets, the holder index and the timers. It
// appends the ended leases, to prune, to ended, and the keys of leases
// whose key has no state to keyless. kss, when not nil, is the state of
// each lease's key (nil for none), which it otherwise looks up.
func (n rebuilder) rebuildLeases(leases []*Lease, kss []*keyState, ended []pruneItem, keyless []string) ([]pruneItem, []string, error) {
	for i, l := range leases {
		n.leases.Put(l)
		if h := l.idemHash(); !h.IsZero() {
			// An active lease keeps its idempotency hash over an ended
			// one (they share one only after a restore: Rebase).
			if prev := n.leases.Get(n.idem[h]); prev == nil || prev.Terminal() || !l.Terminal() {
				n.idem[h] = l.ID
			}
		}
		var ks *keyState
		if kss != nil {
			ks = kss[i]
		} else {
			ks = n.keys.Get(l.Key)
		}
		if ks != nil {
			ks.refs++
		}
		if l.Terminal() {
			ended = append(ended, pruneItem{tick: l.EndedTick(), kind: kindLease, id: l.ID})
			if ks == nil {
				keyless = append(keyless, l.Key)
			}
			continue
		}
		if ks == nil {
			return nil, nil, fmt.Errorf("fsm: snapshot: active lease %s on key without state", l.ID)
		}
		ks.addActive(l.ID)
		n.active++
		n.holder(l.Holder).leases.insert(l.ID)
		if l.SessionID == "" {
			n.schedule(leaseDeadline(l), kindLease, l.ID)
		} else if s := n.sessions[l.SessionID]; s == nil || s.State != SessionActive {
			// Its session ended with more leases than one chunk could
			// end: its end is in the backlog (expire.go).
			n.backlog = append(n.backlog, timer{kind: kindLease, id: l.ID})
		}
	}
	return ended, keyless, nil
}

// rebuildSessions enters the active sessions in the holder index and the
// timers, and appends the ended ones to ended, to prune.
func (n rebuilder) rebuildSessions(sessions []*Session, ended []pruneItem) []pruneItem {
	for _, s := range sessions {
		if s.State != SessionActive {
			ended = append(ended, pruneItem{tick: s.EndedTick, kind: kindSession, id: s.ID})
			continue
		}
		n.sessOpen++
		n.holder(s.Holder).sessions.insert(s.ID)
		n.schedule(s.ExpiresTick+GraceTicks, kindSession, s.ID)
	}
	return ended
}

// rebuildKeys puts every key's active leases in grant order and queues its
// waiters, with their timers and those of its blocked slots.
func (n rebuilder) rebuildKeys(keys []keyRec) {
	for _, k := range keys {
		ks := k.ks
		if a := ks.active(); len(a) > 1 {
			// Grant order; ids break ties (only a damaged snapshot has them).
			slices.SortStableFunc(a, func(a, b string) int {
				return cmp.Compare(n.leases.Get(a).Fence, n.leases.Get(b).Fence)
			})
		}
		for _, w := range k.waiters {
			if w.Cmd.Holder == "" && w.Cmd.SessionID != "" {
				// Queued before waiters named their holder (lease.go).
				if s := n.sessions[w.Cmd.SessionID]; s != nil {
					w.Cmd.Holder = s.Holder
				}
			}
			n.queueWaiter(ks, w)
			n.schedule(w.Deadline, kindWait, k.key+"\x00"+w.Cmd.LeaseID)
			if !w.Cmd.IdemHash.IsZero() {
				n.idem[w.Cmd.IdemHash] = w.Cmd.LeaseID
			}
		}
		for _, b := range ks.blocked() {
			n.schedule(b.Until, kindDelay, k.key)
		}
	}
}

// countKeys returns the keys of lease records, sorted, each with its count
// of records: the keys (sorted) whose state rebuild counted in refs (which
// it resets), merged with keyless, the keys of records without key state.
func countKeys(keys []keyRec, keyless []string) []keyRef {
	slices.Sort(keyless)
	var extra []keyRef
	for i, k := range keyless {
		if i > 0 && k == keyless[i-1] {
			extra[len(extra)-1].n++
			continue
		}
		extra = append(extra, keyRef{k, 1})
	}
	refs := make([]keyRef, 0, len(keys)+len(extra))
	j := 0
	for _, k := range keys {
		if k.ks.refs == 0 {
			continue
		}
		for j < len(extra) && extra[j].key < k.key {
			refs = append(refs, extra[j])
			j++
		}
		refs = append(refs, keyRef{k.key, k.ks.refs})
		k.ks.refs = 0
	}
	return append(refs, extra[j:]...)
}

// holderName returns the name of the holder named b, its string shared
// with every record of the holder. The holder is entered in the holder
// index (rebuild removes it again if nothing active refers to it).
func (n rebuilder) holderName(b []byte) string {
	if hi := n.holders[string(b)]; hi != nil {
		return hi.name
	}
	return n.holder(string(b)).name
}

// knownReasons are the end reasons the state machine sets itself; a decoded
// reason equal to one shares its string.
var knownReasons = [...]string{ReasonExpired, ReasonSessionEnded, ReasonHolderReleased, ReasonRevoked, ReasonReleased, "ended"}

func internReason(b []byte) string {
	for _, r := range knownReasons {
		if string(b) == r {
			return r
		}
	}
	return string(b)
}
