package fsm

import (
	"fmt"
	"testing"
)

// The stolen slots of a key (the "previous" of its next grants) stay bounded
// by the largest limit the key was used with, however often its leases
// expire or are revoked, even with nothing ever pruned; each grant names the
// oldest of them.
func TestStolenBounded(t *testing.T) {
	f := New()
	idx := uint64(0)
	apply := func(c Command) []Result {
		idx++
		return f.Apply(idx, c)
	}
	var queue []string // involuntarily ended, slot not re-granted: the model
	check := func() {
		t.Helper()
		for _, e := range f.TakeEvents() {
			switch e.Type {
			case EventExpired, EventRevoked:
				queue = append(queue, e.Lease.ID)
			case EventAcquired:
				want := ""
				if len(queue) > 0 {
					want, queue = queue[0], queue[1:]
				}
				if e.Previous != want {
					t.Fatalf("%s acquired with previous %q, want %q", e.Lease.ID, e.Previous, want)
				}
			}
		}
		ks := f.keys.Get("k")
		if ks == nil {
			if len(queue) > 0 {
				t.Fatalf("key state dropped with %d stolen slots", len(queue))
			}
			return
		}
		if len(ks.stolen()) > 3 || len(ks.stolen())+len(ks.active()) > 3 {
			t.Fatalf("%d stolen and %d active slots, limit at most 3", len(ks.stolen()), len(ks.active()))
		}
	}
	apply(&Tick{Tick: 1, PeriodMS: 100})
	n := 0
	for round := range 300 {
		limit := uint32(1 + round%3)
		var ids []string
		for range limit {
			n++
			id := fmt.Sprintf("L%d", n)
			r := apply(&Acquire{LeaseID: id, Key: "k", Holder: "h", Limit: limit, TokenHash: HashOf(id),
				TTLMS: 100, TTLTicks: 1, WallMS: 1})
			if r[0].Err != nil {
				t.Fatalf("round %d: %v", round, r[0].Err)
			}
			ids = append(ids, id)
			check()
		}
		switch round % 4 {
		case 1:
			apply(&Revoke{LeaseID: ids[0]})
		case 2:
			apply(&Release{LeaseID: ids[0], TokenHash: HashOf(ids[0])})
		}
		check()
		for f.active > 0 {
			apply(&Tick{Tick: f.tick + 1})
			check()
		}
	}
}
