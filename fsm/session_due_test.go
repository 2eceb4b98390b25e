package fsm

import (
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// A session due to expire at a tick gets nothing granted at that tick, even
// when a lease expiring at the same tick frees the slot its waiter wants.
func TestNoGrantToSessionDueThisTick(t *testing.T) {
	f := New()
	idx := uint64(0)
	ap := func(c Command) []Result { idx++; return f.Apply(idx, c) }
	ap(&Tick{Tick: 1, PeriodMS: 100})
	ap(&SessionCreate{SessionID: "S", Holder: "w", TokenHash: HashOf("s"), TTLMS: 500, TTLTicks: 5})
	ap(&Acquire{LeaseID: "L", Key: "k", Holder: "a", Limit: 1, TokenHash: HashOf("l"), TTLMS: 500, TTLTicks: 5})
	r := ap(&Acquire{LeaseID: "W", Key: "k", Limit: 1, SessionID: "S", SessionTokenHash: HashOf("s"),
		TokenHash: HashOf("w"), WaitTicks: 100, LockDelayTicks: 50})
	if !r[0].Queued {
		t.Fatalf("not queued: %+v", r[0])
	}
	var notices []Notice
	for tk := uint64(2); tk <= 8; tk++ {
		ap(&Tick{Tick: tk})
		notices = append(notices, f.TakeNotices()...)
	}
	if l := f.Lease("W"); l != nil {
		t.Fatalf("W was granted to a session expiring in the same tick: %+v", l)
	}
	if len(notices) != 1 || notices[0].LeaseID != "W" || notices[0].Err == nil || notices[0].Err.Code != wire.CodeSessionEnded {
		t.Fatalf("notices %+v, want W refused with SESSION_ENDED", notices)
	}
	if until := f.KeyLockDelay("k"); until != 0 {
		t.Fatalf("key in lock-delay until %d for a lease nobody held", until)
	}
}
