package fsm_test

import (
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestRevokeLockDelayCountsFromNextTick checks, against the worst case of
// the tick schedule, that a revoked lease's slot stays blocked for its whole
// lock_delay_ms after the revoke is acknowledged.
//
// The node asks for ceil(lock_delay_ms/period)+1 ticks. A revoke applies
// between two ticks, at time a; the next tick may commit right after it,
// and each later tick is proposed at least a period after the one before
// and only once that one has applied, so tick T+j (T the tick the revoke
// applied in, j >= 2) is committed no sooner than a + (j-2)*period. Any
// acquire applied after a tick that could have committed less than
// lock_delay_ms after a must be refused with LOCK_DELAY.
func TestRevokeLockDelayCountsFromNextTick(t *testing.T) {
	for _, delayMS := range []int64{1, periodMS / 2, periodMS, 2 * periodMS, 3*periodMS + 1} {
		h := newHarness(t)
		h.tick(3)
		delayTicks := uint64((delayMS+periodMS-1)/periodMS) + 1 // node.Acquire's rounding
		a := acq("L", "k", "alice", 100)
		a.LockDelayMS, a.LockDelayTicks = delayMS, delayTicks
		if r := h.one(a); r.Err != nil {
			t.Fatal(r.Err)
		}
		h.tick(2)
		if r := h.one(&fsm.Revoke{LeaseID: "L", Reason: "stuck"}); r.Err != nil {
			t.Fatal(r.Err)
		}
		for j := uint64(1); j < delayTicks+4; j++ {
			h.tick(1)
			earliest := int64(0) // of tick T+j after the revoke, in ms
			if j >= 2 {
				earliest = int64(j-2) * periodMS
			}
			r := h.one(acq(fmt.Sprintf("M%d", j), "k", "bob", 10))
			if earliest < delayMS {
				if code(r.Err) != wire.CodeLockDelay {
					t.Fatalf("lock_delay_ms=%d: acquire after tick T+%d (possibly %d ms after the revoke) got %v, want LOCK_DELAY",
						delayMS, j, earliest, r.Err)
				}
				continue
			}
			if r.Err != nil {
				t.Fatalf("lock_delay_ms=%d: acquire after tick T+%d (>= %d ms after the revoke) refused: %v", delayMS, j, earliest, r.Err)
			}
			break
		}
	}
}

// TestExpiryLockDelayKeepsItsLength pins the expiry case, which applies at
// a tick boundary: ceil(ms/period)+1 ticks are enough there, and no more
// are added.
func TestExpiryLockDelayKeepsItsLength(t *testing.T) {
	h := newHarness(t)
	if r := h.one(withDelay(acq("L", "k", "alice", 2), 3)); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.tickTo(2 + fsm.GraceTicks)
	if got := h.f.KeyLockDelay("k"); got != 2+fsm.GraceTicks+3 {
		t.Fatalf("expiry lock-delay until %d, want %d", got, 2+fsm.GraceTicks+3)
	}
}
