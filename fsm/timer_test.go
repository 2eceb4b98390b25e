package fsm

import "testing"

// Renewing a lease or heartbeating a session does not add timers: each has
// one pending timer, which moves when it comes due, and they still expire
// at their deadline.
func TestOneTimerPerRecord(t *testing.T) {
	f := New()
	idx := uint64(0)
	apply := func(c Command) {
		idx++
		if r := f.Apply(idx, c); r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
	}
	timers := func() int {
		n := 0
		for _, b := range f.buckets {
			n += b.len()
		}
		return n
	}
	apply(&Tick{Tick: 1, PeriodMS: 100})
	apply(&Acquire{LeaseID: "L", Key: "k", Holder: "h", Limit: 1, TokenHash: HashOf("l"), TTLMS: 1000, TTLTicks: 10})
	apply(&SessionCreate{SessionID: "S", Holder: "h", TokenHash: HashOf("s"), TTLMS: 1000, TTLTicks: 10})
	for tick := uint64(2); tick < 100; tick++ {
		apply(&Tick{Tick: tick})
		apply(&Renew{LeaseID: "L", TokenHash: HashOf("l")})
		apply(&SessionHeartbeat{SessionID: "S", TokenHash: HashOf("s")})
		if n := timers(); n != 2 {
			t.Fatalf("tick %d: %d timers pending, want 2", tick, n)
		}
	}
	// Last renewed at tick 99: both end at 109 and expire at 109+GraceTicks.
	for tick := uint64(100); tick < 109+GraceTicks; tick++ {
		apply(&Tick{Tick: tick})
		if f.Lease("L").Terminal() || f.Session("S").State != SessionActive {
			t.Fatalf("ended at tick %d", tick)
		}
	}
	apply(&Tick{Tick: 109 + GraceTicks})
	if f.Lease("L").State != StateExpired || f.Session("S").State != SessionExpired {
		t.Fatalf("not expired at tick %d: %s, %s", f.tick, f.Lease("L").State, f.Session("S").State)
	}
	if n := timers(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}
