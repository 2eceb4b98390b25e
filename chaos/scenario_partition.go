package chaos

import (
	"context"
	"fmt"
	"time"
)

// The partition class of the built-in scenarios (scenario_table.go assembles them).

// partitionScenarios cut nodes off from peers (or from clients).
var partitionScenarios = []*Scenario{
	{Name: "partition-leader", Liveness: true, Configuration: true, Class: "partition", Doc: "cut the leader off from every peer; clients still reach it",
		Expect: map[string]int{"leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone", l), faultFor,
				func() error { return e.C.Partition([][]int{{l}, e.Others(l)}) }, e.C.Heal)
		}},
	{Name: "partition-one", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "cut one follower off: it applies nothing while cut off",
		Expect: map[string]int{"node-stalled": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.cutFault(ctx, false, "partition", fmt.Sprintf("follower %d alone", f), faultFor,
				func() error { return e.C.Partition([][]int{{f}, e.Others(f)}) }, e.C.Heal)
		}},
	{Name: "partition-halves", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "random halves, twice: the minority applies nothing while cut off",
		Expect: map[string]int{"node-stalled": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			for r := 0; r < 2; r++ {
				perm := e.Rng.Perm(e.C.Size())
				a, b := perm[:e.C.Size()/2], perm[e.C.Size()/2:]
				if err := e.cutFault(ctx, false, "partition", fmt.Sprintf("halves %v | %v", a, b), faultFor/2,
					func() error { return e.C.Partition([][]int{a, b}) }, e.C.Heal); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "partition-ring", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "majorities ring: every node sees a majority, no two the same; a node the leader cannot reach applies nothing meanwhile",
		Expect: map[string]int{"node-stalled": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			n := e.C.Size()
			// Every node sees a majority but no majority sees each
			// other: Raft need not keep a leader (the window is excused);
			// once healed, the clock must resume within the bound.
			return e.cutFault(ctx, true, "partition", "majorities ring", faultFor, func() error {
				if err := e.C.Heal(); err != nil {
					return err
				}
				for i := 0; i < n; i++ {
					for j := 0; j < n; j++ {
						d := (j - i + n) % n
						if d > 1 && d < n-1 { // not a ring neighbour
							if err := e.C.Block(i, j); err != nil {
								return err
							}
						}
					}
				}
				return nil
			}, e.C.Heal)
		}},
	{Name: "partition-bridge", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "two halves joined by one bridge node, a follower; a node the leader cannot reach applies nothing meanwhile",
		Expect: map[string]int{"node-stalled": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			// The bridge is a follower: a leader as the bridge reaches
			// every node, and the cut changes nothing.
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			bridge := fs[e.Rng.IntN(len(fs))]
			rest := e.Others(bridge)
			e.Rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
			a, b := rest[:len(rest)/2], rest[len(rest)/2:]
			// Two majorities (the bridge with either half) share the
			// bridge: the far half's elections, through it, can unseat
			// the leader again and again. The window is excused, the
			// healing is not.
			return e.cutFault(ctx, true, "partition", fmt.Sprintf("bridge %d between %v and %v", bridge, a, b), faultFor, func() error {
				if err := e.C.Heal(); err != nil {
					return err
				}
				for _, x := range a {
					for _, y := range b {
						if err := e.C.Block(x, y); err != nil {
							return err
						}
						if err := e.C.Block(y, x); err != nil {
							return err
						}
					}
				}
				return nil
			}, e.C.Heal)
		}},
	{Name: "partition-raft-leader", Liveness: true, Class: "partition", Nodes: 3,
		Doc:    "cut the leader off from its peers on Raft only: gossip and the HTTP API between servers go on, so every other server still finds it alive",
		Expect: map[string]int{"leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.protoPartition(ctx, l, ProtoRaft, faultFor, "", nil)
		}},
	{Name: "partition-gossip-leader", Liveness: true, Class: "partition", Nodes: 3,
		Doc: "cut the leader off from its peers on gossip only: Raft goes on; the leader's view lists its peers as failed, " +
			"and nothing that gossip decides (capabilities, member replacement) may disturb the log",
		Expect: map[string]int{"gossip-failed-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.protoPartition(ctx, l, ProtoGossip, faultFor, "gossip-failed-seen", e.gossipSeesFailed(l))
		}},
	{Name: "partition-forward", Liveness: true, Class: "partition", Nodes: 3,
		Doc: "cut the leader off from its peers on the HTTP API only (followers cannot forward): Raft and gossip go on; " +
			"requests sent to a follower fail (503 or 504), never twice applied",
		Expect: map[string]int{"forward-failed-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.protoPartition(ctx, l, ProtoHTTP, faultFor, "forward-failed-seen", forwardFails(e.C, e.Others(l)[0]))
		}},
	{Name: "one-way-leader", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "the leader's messages to followers are dropped, then the followers' to the leader",
		Expect: map[string]int{"leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if err := e.Fault(ctx, "one-way", fmt.Sprintf("leader %d -> followers dropped", l), faultFor/2, func() error {
				for _, f := range e.Others(l) {
					if err := e.C.Block(l, f); err != nil {
						return err
					}
				}
				return nil
			}, e.C.Heal); err != nil {
				return err
			}
			l, err = e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.Fault(ctx, "one-way", fmt.Sprintf("followers -> leader %d dropped", l), faultFor/2, func() error {
				for _, f := range e.Others(l) {
					if err := e.C.Block(f, l); err != nil {
						return err
					}
				}
				return nil
			}, e.C.Heal)
		}},
	{Name: "client-isolated", Liveness: true, StallBound: wideStall, Class: "partition", Doc: "clients cannot reach one node (the leader), which keeps its peers: requests sent to it in the window must have failed",
		Expect: map[string]int{"isolated-unanswered": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			var from int64
			return e.Fault(ctx, "client-isolated", fmt.Sprintf("node %d", l), faultFor,
				func() error { from = e.H.Now(); return e.C.IsolateClient(l) },
				func() error {
					// The isolation to prove: what clients sent the node
					// in the window went unanswered.
					n := 0
					for _, o := range e.H.Ops() {
						if o.Node == l && o.Call >= from && o.Status != StatusOK {
							n++
						}
					}
					e.Count("isolated-unanswered", n)
					return e.C.Heal()
				})
		}},
}
