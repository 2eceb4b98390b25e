package fsm

import (
	"maps"
	"slices"
)

// Rebase readies f, a state decoded from an operator's backup, to replace
// cur, the state a running cluster has applied, as of log index index
// (node.RestoreSnapshot calls it, then hands f's snapshot to Raft):
//
//   - f continues at index (never lower than its own index): every entry
//     applied after the restore, and every event it emits, has a higher
//     index than anything before it;
//   - its fencing counter becomes at least cur's, so that a lease granted
//     after the restore gets a higher fencing token than every lease granted
//     before it. (Tokens are max(counter+1, index) of the granting entry,
//     and one entry can grant many leases, so the counter may run ahead of
//     the log index: the index of the restore alone would not be enough.)
//   - the member registry is cur's: like Raft's configuration, membership
//     is the cluster's as it is now, never what it was at backup time;
//   - every queued acquire (wait_ms) of the backup is withdrawn: whoever
//     sent it stopped waiting long ago, and granting it would hand a slot
//     to nobody.
//
// It discards the events and notices this produces and returns how many
// queued acquires it withdrew. cur is only read.
func (f *FSM) Rebase(cur *FSM, index uint64) int {
	f.index = max(f.index, index)
	f.fence = max(f.fence, cur.fence)
	f.members = maps.Clone(cur.members)
	if f.members == nil {
		f.members = make(map[string]MemberRecord)
	}
	n := 0
	for _, id := range sortedKeys(f.waiting) {
		key := f.waiting[id]
		delete(f.waiting, id)
		ks := f.keys[key]
		i := f.findWaiter(key, id)
		if ks == nil || i < 0 {
			continue
		}
		f.forgetIdem(ks.waiters()[i].Cmd.IdemHash, id)
		ks.ext().waiters = slices.Delete(slices.Clone(ks.waiters()), i, i+1)
		f.dropKey(key, ks)
		n++
	}
	// A waiter only queues behind a full key, so withdrawing waiters frees
	// no slot and grants nothing; the wait timers left behind find no
	// waiter when they fire.
	f.events = f.events[:0]
	f.notices = nil
	return n
}
