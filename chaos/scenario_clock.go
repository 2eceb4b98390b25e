package chaos

import (
	"context"
	"fmt"
	"time"
)

// The clock class of the built-in scenarios (scenario_table.go assembles them).

// clockScenarios jump the leader's wall clock and skew its monotonic rate.
var clockScenarios = []*Scenario{
	{Name: "clock-jump-leader", Liveness: true, StallBound: wideStall, Class: "clock",
		Doc:    "the leader's wall clock jumps +5 min, -10 min, then strobes: a grant it stamps shows the jump (acquired_at), while TTLs, expiry and the clock checkers follow the monotonic clock and ticks alone",
		Expect: map[string]int{"clock-jumps": 2, "clock-jump-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			steps := []time.Duration{5 * time.Minute, -10 * time.Minute}
			for i := 0; i < 10; i++ {
				steps = append(steps, time.Duration(e.Rng.Int64N(int64(2*time.Minute)))-time.Minute)
			}
			if err := e.C.ClockJump(l, 0); err != nil {
				return err
			}
			e.H.Note(Event{Type: "nemesis", Name: "clock", Phase: "start", Detail: fmt.Sprintf("leader %d wall clock", l)})
			for _, s := range steps {
				if err := e.C.ClockJump(l, s); err != nil {
					return err
				}
				e.Count("clock-jumps", 1)
				if err := sleepCtx(ctx, 400*time.Millisecond); err != nil {
					return err
				}
				if s == 5*time.Minute {
					e.clockJumpSeen(ctx, l, s)
				}
			}
			e.H.Note(Event{Type: "nemesis", Name: "clock", Phase: "stop", Detail: fmt.Sprintf("leader %d wall clock", l)})
			return nil
		}},
	{Name: "clock-rate-leader", Liveness: true, StallBound: wideStall, Class: "clock", Eps: 0.05, Doc: "the leader's monotonic clock runs at 0.5x, then at 1.04x (within the 5% the holders allow): the cluster clock read at 0.5x runs at most 0.75 of real time",
		Expect: map[string]int{"slow-clock-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			for _, r := range []float64{0.5, 1.04} {
				l, err := e.WaitLeader(ctx, 10*time.Second)
				if err != nil {
					return err
				}
				var from int64
				if err := e.Fault(ctx, "clock-rate", fmt.Sprintf("leader %d at %.2fx", l, r), faultFor/2,
					func() error { from = e.H.Now(); return e.C.ClockRate(l, r) }, func() error {
						if r < 1 {
							// The slow clock to prove, from the tick reads
							// after a period's settling (a tick already
							// scheduled comes at the old pace).
							rate := e.H.tickRate(from+int64(time.Second), e.H.Now())
							if rate <= 0.75 {
								e.Count("slow-clock-seen", 1)
							}
							e.Note("clock-rate", fmt.Sprintf("the cluster clock ran at %.2f of real time while leader %d was at %.2fx", rate, l, r), nil)
						}
						return e.C.ClockRate(l, 1)
					}); err != nil {
					return err
				}
			}
			return nil
		}},
}
