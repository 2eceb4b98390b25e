package chaos

import (
	"context"
	"fmt"
	"time"
)

// The loss and latency classes of the built-in scenarios (scenario_table.go assembles them).

// lossLatencyScenarios degrade links: dropped packets, then delayed ones.
var lossLatencyScenarios = []*Scenario{
	{Name: "loss", Liveness: true, StallBound: wideStall, Class: "loss", Doc: "every node drops 20% of its packets to peers: the loss rules (or the in-process fault table) count what they dropped",
		Expect: map[string]int{"loss-hits": 20},
		Nemesis: func(ctx context.Context, e *Env) error {
			var before int64
			return e.Fault(ctx, "loss", "20% everywhere", faultFor, func() error {
				for i := 0; i < e.C.Size(); i++ {
					if err := e.C.Loss(i, 0.2); err != nil {
						return err
					}
				}
				if lc, ok := e.C.(lossCounter); ok {
					before, _ = lc.LossHits()
				}
				return nil
			}, func() error {
				// The loss to prove: what the rules dropped (read before
				// healing: a table's counters go with its rules).
				if lc, ok := e.C.(lossCounter); ok {
					after, err := lc.LossHits()
					e.Count("loss-hits", int(after-before))
					e.Note("loss", fmt.Sprintf("%d packets, dials or writes dropped or held back", after-before), err)
				}
				return e.C.Heal()
			})
		}},
	{Name: "latency", Liveness: true, StallBound: wideStall, Class: "latency", Doc: "the leader's messages to peers are delayed 80 ms, then every node's 30 ms: a write through the delayed leader takes 80 ms at least",
		Expect: map[string]int{"delay-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if err := e.Fault(ctx, "delay", fmt.Sprintf("leader %d +80ms", l), faultFor/2,
				func() error { return e.C.Delay(l, 80*time.Millisecond) }, func() error {
					// The delay to prove: a commit through the delayed
					// leader waits for a follower's answer to a delayed
					// message.
					lat, err := e.writeLatency(ctx, l)
					if err == nil && lat >= 64*time.Millisecond {
						e.Count("delay-seen", 1)
					}
					e.Note("delay", fmt.Sprintf("the fastest of 3 writes through leader %d took %v", l, lat.Round(time.Millisecond)), err)
					return e.C.Heal()
				}); err != nil {
				return err
			}
			return e.Fault(ctx, "delay", "all +30ms", faultFor/2, func() error {
				for i := 0; i < e.C.Size(); i++ {
					if err := e.C.Delay(i, 30*time.Millisecond); err != nil {
						return err
					}
				}
				return nil
			}, e.C.Heal)
		}},
}
