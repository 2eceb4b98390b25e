package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// The built-in scenarios (Scenarios, FindScenario).

const faultFor = 6 * time.Second

// wideStall is the liveness bound of the scenarios that check liveness
// beside their own fault: twice LivenessBound, as the in-process tier runs
// them under the race detector on a shared machine. A clock that stopped
// fails it all the same.
const wideStall = 2 * LivenessBound

var builtin = []*Scenario{
	{Name: "none", Liveness: true, StallBound: wideStall, Class: "none", Nodes: 3, Doc: "no faults: the workloads and checkers alone (zombie counter writers must be refused by token)",
		Expect:  map[string]int{"stale-token-rejected": 1},
		Nemesis: func(ctx context.Context, e *Env) error { return sleepCtx(ctx, faultFor) }},
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
			return e.protoPartition(ctx, l, ProtoHTTP, faultFor, "forward-failed-seen", e.forwardFails(e.Others(l)[0]))
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
							rate := e.tickRate(from+int64(time.Second), e.H.Now())
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
	{Name: "disk-stall-leader", Class: "disk", Liveness: true,
		Doc:    "the leader's disk stalls (every log and stable-store write blocks) for 12 s, then the next leader's for 6 s: its heartbeats keep the followers loyal while it commits nothing, so it must give leadership up",
		Expect: map[string]int{"leader-changes": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			for _, d := range []time.Duration{12 * time.Second, 6 * time.Second} {
				l, err := e.WaitLeader(ctx, 15*time.Second)
				if err != nil {
					return err
				}
				if err := e.Fault(ctx, "disk-stall", fmt.Sprintf("leader %d for %v", l, d), d,
					func() error { return e.C.DiskFault(l, true, 0) }, func() error { return e.C.DiskFault(l, false, 0) }); err != nil {
					return err
				}
				if err := sleepCtx(ctx, 2*time.Second); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "disk-slow-follower", Class: "disk", Liveness: true,
		Doc:    "one follower's every disk write takes 200 ms longer, another's 50 ms, for 8 s: the slower applies further behind than the followers whose disks are sound",
		Expect: map[string]int{"slow-follower-behind": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			perm := e.Rng.Perm(len(fs))
			a, b := fs[perm[0]], fs[perm[1]]
			var w *appliedWatch
			return e.Fault(ctx, "disk-slow", fmt.Sprintf("follower %d +200ms, follower %d +50ms per write", a, b), 8*time.Second,
				func() error {
					if err := e.C.DiskFault(a, false, 200*time.Millisecond); err != nil {
						return err
					}
					if err := e.C.DiskFault(b, false, 50*time.Millisecond); err != nil {
						return err
					}
					w = e.watchApplied(ctx)
					return nil
				}, func() error {
					// The slow disk to prove: follower a applied further
					// behind, on average, than every follower whose disk
					// is sound.
					w.Stop()
					sound := 0.0
					for _, o := range fs {
						if o != a && o != b {
							sound = max(sound, w.meanLag(o))
						}
					}
					lag := w.meanLag(a)
					if lag >= 2 && lag >= 2*sound+1 {
						e.Count("slow-follower-behind", 1)
					}
					e.Note("disk-slow", fmt.Sprintf("mean entries behind: follower %d (+200ms) %.1f, the sound followers at most %.1f", a, lag, sound), nil)
					return errors.Join(e.C.DiskFault(a, false, 0), e.C.DiskFault(b, false, 0))
				})
		}},
	{Name: "disk-stall-majority", Class: "disk", Liveness: true,
		Doc:    "the disks of a majority (the leader and two followers) stall for 8 s: nothing commits (no node applies anything for 3 s or more); once healed the clock must resume within the liveness bound",
		Expect: map[string]int{"commits-stopped": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			perm := e.Rng.Perm(len(fs))
			nodes := []int{l}
			for _, k := range perm[:e.C.Size()/2] {
				nodes = append(nodes, fs[k])
			}
			set := func(stall bool) func() error {
				return func() error {
					var errs []error
					for _, n := range nodes {
						errs = append(errs, e.C.DiskFault(n, stall, 0))
					}
					return errors.Join(errs...)
				}
			}
			var w *appliedWatch
			return e.FaultNoQuorum(ctx, "disk-stall", fmt.Sprintf("nodes %v", nodes), 8*time.Second, func() error {
				if err := set(true)(); err != nil {
					return err
				}
				w = e.watchApplied(ctx)
				return nil
			}, func() error {
				// The stall to prove: nothing committed for a while.
				w.Stop()
				if d := w.nothingApplied(); d >= 3*time.Second {
					e.Count("commits-stopped", 1)
				} else {
					e.Note("disk-stall", fmt.Sprintf("some node applied something at least every %v", d.Round(100*time.Millisecond)), nil)
				}
				return set(false)()
			})
		}},
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
	{Name: "snapshot-catchup", Liveness: true, StallBound: wideStall, Class: "snapshot", SnapshotThreshold: 64,
		Doc:    "small snapshot threshold; a follower is cut off until the leader compacts past it, then healed: it catches up by snapshot install",
		Expect: map[string]int{"snapshots-installed": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			before, _ := e.Local(ctx, f, 0, time.Second)
			err = e.Fault(ctx, "partition", fmt.Sprintf("follower %d alone while the leader compacts", f), 2*faultFor,
				func() error { return e.C.Partition([][]int{{f}, e.Others(f)}) }, e.C.Heal)
			if err != nil {
				return err
			}
			// Wait for the install to show.
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if ls, err := e.Local(ctx, f, 0, time.Second); err == nil && before != nil && ls.SnapshotsInstalled > before.SnapshotsInstalled {
					e.Count("snapshots-installed", ls.SnapshotsInstalled-before.SnapshotsInstalled)
					return nil
				}
				if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "restore-under-load", Class: "restore", Nodes: 3,
		Doc:    "save a snapshot early, restore it mid-run under load: leases live at the restore stay, the file's come back re-fenced on free keys, tokens and ticks never go back",
		Expect: map[string]int{"restores": 1, "restore-file-leases": 1, "restore-kept": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			file, err := e.saveSnapshot(ctx)
			if err != nil {
				return err
			}
			// Long enough for the holders of the file's leases to let
			// most of them go and for other holders to take their keys.
			if err := sleepCtx(ctx, faultFor); err != nil {
				return err
			}
			if err := e.restoreSnapshot(ctx, file); err != nil {
				return err
			}
			return sleepCtx(ctx, faultFor/2)
		}},
	{Name: "restore-lost-leader", Class: "restore", Nodes: 3,
		Doc: "restore a snapshot (padded with 20,000 leases: many chunks) and cut the leader off from the others right after the restore starts: " +
			"whatever it answers, the restore happens on every server at one index or on none, and every server ends with the same state",
		Expect: map[string]int{"restores-cut": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.restoreCutOff(ctx, 20_000)
		}},
	{Name: "restore-large", Class: "restore", Nodes: 3,
		Doc: "under load, restore a snapshot padded to 300,000 leases on real processes (30,000 in process, under the race detector): " +
			"its commit applies for seconds on every server, ticks wait behind it, and the leadership watchdog must not cut it short",
		Expect: map[string]int{"restores": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			pad := 30_000
			if e.Tier == "netns" {
				pad = 300_000
			}
			if v, err := strconv.Atoi(os.Getenv("LEASEHOLD_CHAOS_RESTORE_PAD")); err == nil && v > 0 {
				pad = v // a manual run at another size (a million, say)
			}
			file, restored, err := e.paddedSnapshot(ctx, pad)
			if err != nil {
				return err
			}
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if _, err := e.restoreAttempt(ctx, l, file, restored, 3*time.Minute); err != nil {
				return fmt.Errorf("restore of %d padding leases: %w", pad, err)
			}
			return sleepCtx(ctx, faultFor/2)
		}},
	{Name: "restore-during-backlog", Class: "restore", Nodes: 3,
		Doc: "a session holds 6,000 leases (more than one expiry chunk) when a snapshot is saved; it then expires, and the snapshot is restored " +
			"while its leases are being ended chunk by chunk: the session comes back with the file's leases, what was due ends, every server agrees",
		Expect: map[string]int{"restores": 1, "backlog-leases": 4_097}, // more than one expiry chunk
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.restoreDuringBacklog(ctx, 6_000)
		}},
	{Name: "disk-full-leader", Class: "disk", Nodes: 3, DiskMiB: 160, MinFreeDiskMiB: 32,
		Doc: "fill the leader's disk below --min-free-disk: it refuses acquires and new sessions (429 RESOURCE_EXHAUSTED min_free_disk) " +
			"while renewals and releases go on; once the ballast goes, acquires resume",
		Expect: map[string]int{"disk-refusals": 1, "disk-recovered": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.diskFull(ctx, l)
		}},
	{Name: "disk-full-follower", Class: "disk", Nodes: 3, DiskMiB: 160, MinFreeDiskMiB: 32,
		Doc: "fill a follower's disk below --min-free-disk: the leader learns it through gossip and refuses acquires and new sessions " +
			"while renewals and releases go on; once the ballast goes, acquires resume",
		Expect: map[string]int{"disk-refusals": 1, "disk-recovered": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			others := e.Others(l)
			return e.diskFull(ctx, others[e.Rng.IntN(len(others))])
		}},
	{Name: "bitflip", Class: "disk", Nodes: 3, SnapshotThreshold: 256,
		Doc: "a follower is killed, bits are flipped in the used part of its log segments and snapshot files, and it is restarted: " +
			"it never serves a state that differs from the others' as ready (it refuses, or the state check takes it out), " +
			"and unless it came back with the cluster's state it is wiped and rejoins; a round whose flips changed nothing it reads is repeated (up to 4): " +
			"one must have been refused (bitflip-refused); real processes only",
		Expect: map[string]int{"bitflips": 1, "bitflip-refused": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.bitflip(ctx)
		}},
	{Name: "bitflip-type", Class: "disk", Nodes: 3, SnapshotThreshold: 256,
		Doc: "a follower is killed, and the five latest commands of its log turn into no-ops (one bit of each entry's type), " +
			"which Raft never hands to the state machine; restarted, it must refuse them itself, naming the damaged entry " +
			"(the state check taking it out of service is not enough), never serve as ready a state that lost them, " +
			"and it is then wiped and rejoins; real processes only",
		Expect: map[string]int{"type-flips": 1, "bitflip-type-named": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.bitflipType(ctx)
		}},
	{Name: "bitflip-leader", Class: "disk", Nodes: 3,
		Doc: "bits rot in the running leader's log, within entries it applied; a follower is wiped and catches up from it: " +
			"it never stops on a damaged entry (the leader refuses to send one, the follower gets a snapshot) and comes back " +
			"with the cluster's state; real processes only",
		Expect: map[string]int{"bitflips": 1, "bitflip-leader-caught-up": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.bitflipLeader(ctx)
		}},
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
