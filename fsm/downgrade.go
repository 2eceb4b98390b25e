package fsm

import "fmt"

// ForPreviousRelease prepares a state for a rollback to the release before
// the one that introduced grant keys (edecda9): it drops the member
// registry's grant keys, which that release cannot decode (a restore into
// this release records every server's key again within a reconcile pass,
// but grants signed by retired keys stop verifying). It refuses a state the
// previous release cannot hold at all: a staged restore (save again once
// the restore is over), or lease groups (release them first). It returns
// how many servers' keys were dropped. It also clears the record of the
// cluster's features (features.go), which that release cannot decode.
func (f *FSM) ForPreviousRelease() (int, error) {
	if f.stage != nil {
		return 0, fmt.Errorf("fsm: a restore is staged in this state (its chunks arrived, its commit did not): save again once it is over")
	}
	for l := range f.leases.All() {
		if g := l.GroupID(); g != "" {
			return 0, fmt.Errorf("fsm: the state holds lease group %s (lease %s), which the previous release does not know: release the groups (and let their records age out), then save again", g, l.ID)
		}
	}
	for ks := range f.keys.All() {
		k := ks.key
		if ks.more == nil {
			continue
		}
		for _, w := range ks.more.waitq.list() {
			if w.group != "" {
				return 0, fmt.Errorf("fsm: lease group %s waits on key %q; the previous release does not know lease groups: save again once no group waits", w.group, k)
			}
		}
	}
	f.features = 0 // the previous release does not read the record
	dropped := 0
	for id, m := range f.members {
		if m.GrantKeys != nil {
			m.GrantKeys = nil
			f.members[id] = m
			dropped++
		}
	}
	return dropped, nil
}
