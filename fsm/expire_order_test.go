package fsm

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestExpiryOrderPinned pins which records end in which entry, in which
// order, through storms larger than a chunk: standalone leases with and
// without lock-delays, queued acquires timing out, and sessions that end
// with more leases than their chunk. Which records an Expire entry ends is
// part of the log's meaning: replicas of different releases apply the same
// entries, so a change here must not move a single record. The digest was
// taken from the release whose backlog was a heap and checked unchanged
// when it became a sorted list.
func TestExpiryOrderPinned(t *testing.T) {
	const want = "543a11929887cf25f6f11052c1af5d53f3dd02b188145ae0619e0f19d86d0f3d"
	h := sha256.New()
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 9))
		f := New()
		idx := uint64(0)
		ap := func(c Command) {
			idx++
			f.Apply(idx, c)
			for _, e := range f.TakeEvents() {
				id, fence := "", uint64(0)
				if e.Lease != nil {
					id, fence = e.Lease.ID, e.Lease.Fence
				}
				if e.Session != nil {
					id = e.Session.ID
				}
				fmt.Fprintln(h, idx, e.Type, e.Key, id, fence, e.Reason)
			}
			for _, n := range f.TakeNotices() {
				fmt.Fprintln(h, idx, "notice", n.LeaseID, n.Err != nil)
			}
		}
		ap(&Tick{Tick: 1, PeriodMS: 100, RetainTicks: 3})
		for s := range 3 {
			ap(&SessionCreate{SessionID: fmt.Sprintf("ss_%d", s), Holder: fmt.Sprintf("h%d", s), TokenHash: HashOf("s"),
				TTLMS: 500, TTLTicks: uint64(5 + s)})
		}
		for range 3000 {
			id := fmt.Sprintf("ls_%016x", rng.Uint64())
			key := fmt.Sprintf("k/%d", rng.IntN(2000))
			limit, wait := 1+uint32(rng.IntN(2)), uint64(rng.IntN(8))
			if s := rng.IntN(6); s < 3 {
				ap(&Acquire{LeaseID: id, Key: key, Limit: limit, SessionID: fmt.Sprintf("ss_%d", s), SessionTokenHash: HashOf("s"),
					TokenHash: HashOf(id), WallMS: 1, WaitTicks: wait})
			} else {
				ap(&Acquire{LeaseID: id, Key: key, Holder: "x", Limit: limit, TokenHash: HashOf(id), TTLMS: 500,
					TTLTicks: 3 + uint64(rng.IntN(4)), WallMS: 1, WaitTicks: wait, LockDelayTicks: uint64(rng.IntN(3))})
			}
		}
		for tk := uint64(2); tk < 30; tk++ {
			ap(&Tick{Tick: tk, PeriodMS: 100, RetainTicks: 3, ExpireMax: 97})
			for f.Backlog() > 0 {
				ap(&Expire{Tick: tk, WallMS: 5, Max: 97 + uint64(rng.IntN(50))})
				if rng.IntN(5) == 0 {
					id := fmt.Sprintf("ls_%016x", rng.Uint64())
					ap(&Acquire{LeaseID: id, Key: fmt.Sprintf("k/%d", rng.IntN(2000)), Holder: "y", Limit: 1,
						TokenHash: HashOf(id), TTLMS: 500, TTLTicks: 2, WallMS: 1, WaitTicks: 3})
				}
			}
		}
		if f.active != 0 {
			t.Fatalf("seed %d: %d leases still active at tick %d", seed, f.active, f.tick)
		}
	}
	if got := fmt.Sprintf("%x", h.Sum(nil)); got != want {
		t.Fatalf("the records ended, and their entries, changed: digest %s, pinned %s", got, want)
	}
}
