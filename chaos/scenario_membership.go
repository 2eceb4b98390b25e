package chaos

import (
	"context"
	"fmt"
	"time"
)

// The transfer, membership, wipe and renumber classes of the built-in
// scenarios (scenario_table.go assembles them): leadership and membership
// changes, and nodes that come back empty or at a new address.

// transferScenarios move leadership on.
var transferScenarios = []*Scenario{
	{Name: "transfer-storm", Liveness: true, StallBound: wideStall, Class: "transfer", Doc: "for 8 s, leadership moves on right after each tick (the tick-compression trap: a new leader that ticks at once runs the clock fast)",
		Expect: map[string]int{"leader-changes": 5, "transfers": 5},
		Nemesis: func(ctx context.Context, e *Env) error {
			e.H.Note(Event{Type: "nemesis", Name: "transfer-storm", Phase: "start"})
			defer e.H.Note(Event{Type: "nemesis", Name: "transfer-storm", Phase: "stop"})
			end := time.Now().Add(8 * time.Second)
			var lastTick uint64
			for time.Now().Before(end) {
				// Chase the clock: as soon as the leader has committed a
				// new tick, hand leadership on. A correct new leader waits
				// a period before its first tick; one that ticks at once
				// makes a tick per hand-over, faster than real time.
				if l := e.Leader(ctx); l >= 0 {
					if st, err := e.Admin(l).Cluster(ctx); err == nil && st.Tick > lastTick {
						if err := e.Admin(l).TransferLeadership(ctx, ""); err == nil {
							e.Count("transfers", 1)
							lastTick = st.Tick
						}
					}
				}
				if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
					return err
				}
			}
			return nil
		}},
}

// membershipScenarios remove servers and let them rejoin.
var membershipScenarios = []*Scenario{
	{Name: "remove-leader", Liveness: true, StallBound: wideStall, Class: "membership", Doc: "remove the leader from the cluster, then wipe it and let it rejoin as a new server",
		Expect: map[string]int{"leader-changes": 1, "removals": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.removeAndRejoin(ctx, l, false)
		}},
	{Name: "remove-partitioned", Liveness: true, StallBound: wideStall, Class: "membership", Doc: "partition a follower off, remove it, heal, wipe it and let it rejoin",
		Expect: map[string]int{"removals": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.removeAndRejoin(ctx, f, true)
		}},
}

// identityScenarios wipe or renumber nodes (classes wipe, renumber).
var identityScenarios = []*Scenario{
	{Name: "wiped-node", Liveness: true, StallBound: wideStall, Class: "wipe", Doc: "a follower is killed and its data directory wiped; it is removed and rejoins empty",
		Expect: map[string]int{"removals": 1, "wipes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			if err := e.C.Wipe(f); err != nil {
				return err
			}
			e.Count("wipes", 1)
			e.Note("wipe", fmt.Sprintf("node %d killed, data wiped", f), nil)
			if err := sleepCtx(ctx, 2*time.Second); err != nil {
				return err
			}
			return e.rejoinWiped(ctx, f, true)
		}},
	{Name: "renumber-follower", Class: "renumber", Nodes: 3, Doc: "a follower's namespace is renumbered under load: killed, it restarts with its data directory and id at a new IP; it rejoins as itself (the leader updates its Raft address), without an election storm, nothing lost",
		Expect: map[string]int{"renumbers": 1, "renumbered-rejoined": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			if err := e.renumberRejoin(ctx, f, l); err != nil {
				return err
			}
			return sleepCtx(ctx, faultFor/2)
		}},
	{Name: "wipe-restart-original", Class: "wipe", Nodes: 3, Doc: "the leader is killed and wiped, the others SIGSTOPped while it restarts with its original command; it must neither form a cluster with them nor vote with an empty log: the leader replaces the old member and it rejoins empty",
		Expect: map[string]int{"wipes": 1, "wiped-rejoined": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.wipeRestartOriginal(ctx, l, 3*time.Second)
		}},
}
