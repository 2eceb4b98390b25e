package chaos

import (
	"context"
	"fmt"
	"time"
)

// The process classes of the built-in scenarios (scenario_table.go assembles them):
// crash (SIGKILL, power cut), diverge and pause (SIGSTOP).

// crashScenarios kill, cut the power of, tell to stop serving, or pause
// servers (classes crash, diverge, pause).
var crashScenarios = []*Scenario{
	{Name: "kill-leader", Liveness: true, Configuration: true, Class: "crash", Doc: "SIGKILL the leader, restart it; twice",
		Expect: map[string]int{"leader-changes": 2, "restarts": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			for r := 0; r < 2; r++ {
				l, err := e.WaitLeader(ctx, 15*time.Second)
				if err != nil {
					return err
				}
				if err := e.killRestart(ctx, []int{l}, faultFor/2); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "diverged-follower", Class: "diverge", Nodes: 3, Doc: "tell a follower its state differs (the state check's notice, over the Raft port); it must answer no read or event stream from its state until it restarts",
		Expect:  map[string]int{"diverged-refusals": 3, "restarts": 1},
		Nemesis: divergeFollower},
	{Name: "kill-one", Liveness: true, StallBound: wideStall, Class: "crash", Doc: "SIGKILL one random follower, restart it",
		Expect: map[string]int{"restarts": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.killRestart(ctx, []int{f}, faultFor)
		}},
	{Name: "kill-minority", Liveness: true, Configuration: true, StallBound: wideStall, Class: "crash", Doc: "SIGKILL two random nodes (a minority of five), restart them",
		Expect: map[string]int{"restarts": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			perm := e.Rng.Perm(e.C.Size())
			return e.killRestart(ctx, perm[:(e.C.Size()-1)/2], faultFor)
		}},
	{Name: "kill-all", Liveness: true, Configuration: true, StallBound: wideStall, Class: "crash", Nodes: 3, Doc: "SIGKILL every node at once and restart them: acknowledged grants and fences survive",
		Expect: map[string]int{"restarts": 3},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.killRestart(ctx, e.Others(), 2*time.Second)
		}},
	{Name: "power-cut-leader", Liveness: true, Class: "crash", Nodes: 3, PowerCut: true,
		Doc:    "cut the leader's power (SIGKILL, and every write it had not fsynced is lost), restart it; twice",
		Expect: map[string]int{"power-cuts": 2, "restarts": 2, "leader-changes": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			for r := 0; r < 2; r++ {
				l, err := e.WaitLeader(ctx, 15*time.Second)
				if err != nil {
					return err
				}
				if err := e.powerCutRestart(ctx, []int{l}, faultFor/2); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "power-cut-minority", Liveness: true, Class: "crash", PowerCut: true,
		Doc:    "cut the power of two random nodes of five at once (their unsynced writes lost), restart them",
		Expect: map[string]int{"power-cuts": 2, "restarts": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			perm := e.Rng.Perm(e.C.Size())
			return e.powerCutRestart(ctx, perm[:(e.C.Size()-1)/2], faultFor)
		}},
	{Name: "power-cut-all", Class: "crash", Nodes: 3, PowerCut: true,
		Doc:    "cut every node's power at once and restart them: every acknowledged write was fsynced by a majority, so it survives",
		Expect: map[string]int{"power-cuts": 3, "restarts": 3},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.powerCutRestart(ctx, e.Others(), 2*time.Second)
		}},
	{Name: "truncate-restart", Liveness: true, Class: "crash", Doc: "cut the leader off while clients still reach it (its log gains entries the others never commit), heal (it drops them for the new leader's), then SIGKILL and restart it: a server must read back a log whose end it cut",
		Expect: map[string]int{"leader-changes": 1, "restarts": 1, "uncommitted-entries": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if err := e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone", l), faultFor,
				func() error { return e.C.Partition([][]int{{l}, e.Others(l)}) },
				func() error {
					// The truncation to prove: entries past the cut-off
					// leader's commit index, of a term the others left
					// behind, which the heal makes it drop.
					if ls, err := e.Local(ctx, l, 0, time.Second); err == nil && ls.LastIndex > ls.CommitIndex {
						e.Count("uncommitted-entries", int(ls.LastIndex-ls.CommitIndex))
					}
					return e.C.Heal()
				}); err != nil {
				return err
			}
			// Healed, the old leader takes the new leader's entries,
			// dropping its own uncommitted ones; then it crashes.
			if err := sleepCtx(ctx, 2*time.Second); err != nil {
				return err
			}
			return e.killRestart(ctx, []int{l}, faultFor/2)
		}},
	{Name: "pause-leader", Liveness: true, Class: "pause", Doc: "SIGSTOP the leader past the election timeout, then past a TTL",
		Expect: map[string]int{"leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			for _, d := range []time.Duration{1500 * time.Millisecond, 4 * time.Second} {
				l, err := e.WaitLeader(ctx, 15*time.Second)
				if err != nil {
					return err
				}
				if err := e.Fault(ctx, "pause", fmt.Sprintf("leader %d for %v", l, d), d,
					func() error { return e.C.Pause(l) }, func() error { return e.C.Resume(l) }); err != nil {
					return err
				}
				if err := sleepCtx(ctx, 2*time.Second); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "pause-leader-long", Liveness: true, StallBound: wideStall, Class: "pause", Nodes: 3,
		Doc:    "SIGSTOP the leader for 8 s while probes write and read through the others: none waits on it past the forward bound, and writes through a follower succeed once another node leads",
		Expect: map[string]int{"leader-changes": 1, "follower-writes-after-election": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 15*time.Second)
			if err != nil {
				return err
			}
			if err := e.pauseProbed(ctx, l, 8*time.Second); err != nil {
				return err
			}
			return sleepCtx(ctx, 2*time.Second)
		}},
}
