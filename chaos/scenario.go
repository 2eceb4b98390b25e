package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Scenario is one chaos experiment: a cluster size, a nemesis schedule run
// beside the workloads, and what must have happened for the run to count
// (effectiveness).
type Scenario struct {
	Name string
	Doc  string
	// Nodes is the cluster size (default 5).
	Nodes int
	// Class is the nemesis class the scenario covers (partition, loss,
	// latency, crash, pause, clock, disk, transfer, membership, snapshot,
	// wipe, restore, none).
	Class string
	// Nemesis runs after the warm-up and must heal whatever it broke
	// before it returns.
	Nemesis func(ctx context.Context, e *Env) error
	// SnapshotThreshold, if > 0, makes nodes snapshot and compact after
	// that many log entries (snapshot pressure).
	SnapshotThreshold int
	// Expect lists effectiveness counters and their minimum (e.g.
	// "leader-changes": 1, "snapshots-installed": 1).
	Expect map[string]int
	// Eps overrides the TTL safety fraction (clock-rate scenarios).
	Eps float64
	// Liveness adds the liveness checker (CheckLiveness): with a healthy
	// majority, the cluster clock never stands still longer than
	// LivenessBound.
	Liveness bool
}

func (s *Scenario) nodes() int {
	if s.Nodes == 0 {
		return 5
	}
	return s.Nodes
}

// Scenarios lists the built-in scenarios by name.
func Scenarios() []*Scenario {
	out := append([]*Scenario(nil), builtin...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FindScenario returns the named scenario.
func FindScenario(name string) (*Scenario, error) {
	for _, s := range builtin {
		if s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("chaos: no scenario %q (leasehold chaos --list names them)", name)
}

const faultFor = 6 * time.Second

var builtin = []*Scenario{
	{Name: "none", Class: "none", Nodes: 3, Doc: "no faults: the workloads and checkers alone (zombie counter writers must be refused by token)",
		Expect:  map[string]int{"stale-token-rejected": 1},
		Nemesis: func(ctx context.Context, e *Env) error { return sleepCtx(ctx, faultFor) }},
	{Name: "partition-leader", Liveness: true, Class: "partition", Doc: "cut the leader off from every peer; clients still reach it",
		Expect: map[string]int{"leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone", l), faultFor,
				func() error { return e.C.Partition([][]int{{l}, e.Others(l)}) }, e.C.Heal)
		}},
	{Name: "partition-one", Class: "partition", Doc: "cut one follower off",
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.Fault(ctx, "partition", fmt.Sprintf("follower %d alone", f), faultFor,
				func() error { return e.C.Partition([][]int{{f}, e.Others(f)}) }, e.C.Heal)
		}},
	{Name: "partition-halves", Class: "partition", Doc: "random halves, twice",
		Nemesis: func(ctx context.Context, e *Env) error {
			for r := 0; r < 2; r++ {
				perm := e.Rng.Perm(e.C.Size())
				a, b := perm[:e.C.Size()/2], perm[e.C.Size()/2:]
				if err := e.Fault(ctx, "partition", fmt.Sprintf("halves %v | %v", a, b), faultFor/2,
					func() error { return e.C.Partition([][]int{a, b}) }, e.C.Heal); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "partition-ring", Class: "partition", Doc: "majorities ring: every node sees a majority, no two the same",
		Nemesis: func(ctx context.Context, e *Env) error {
			n := e.C.Size()
			return e.Fault(ctx, "partition", "majorities ring", faultFor, func() error {
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
	{Name: "partition-bridge", Class: "partition", Doc: "two halves joined by one bridge node",
		Nemesis: func(ctx context.Context, e *Env) error {
			perm := e.Rng.Perm(e.C.Size())
			bridge, rest := perm[0], perm[1:]
			a, b := rest[:len(rest)/2], rest[len(rest)/2:]
			return e.Fault(ctx, "partition", fmt.Sprintf("bridge %d between %v and %v", bridge, a, b), faultFor, func() error {
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
	{Name: "one-way-leader", Class: "partition", Doc: "the leader's messages to followers are dropped, then the followers' to the leader",
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
	{Name: "client-isolated", Class: "partition", Doc: "clients cannot reach one node (the leader), which keeps its peers",
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.Fault(ctx, "client-isolated", fmt.Sprintf("node %d", l), faultFor,
				func() error { return e.C.IsolateClient(l) }, e.C.Heal)
		}},
	{Name: "loss", Class: "loss", Doc: "every node drops 20% of its packets to peers",
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.Fault(ctx, "loss", "20% everywhere", faultFor, func() error {
				for i := 0; i < e.C.Size(); i++ {
					if err := e.C.Loss(i, 0.2); err != nil {
						return err
					}
				}
				return nil
			}, e.C.Heal)
		}},
	{Name: "latency", Class: "latency", Doc: "the leader's messages to peers are delayed 80 ms, then every node's 30 ms",
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if err := e.Fault(ctx, "delay", fmt.Sprintf("leader %d +80ms", l), faultFor/2,
				func() error { return e.C.Delay(l, 80*time.Millisecond) }, e.C.Heal); err != nil {
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
	{Name: "kill-leader", Liveness: true, Class: "crash", Doc: "SIGKILL the leader, restart it; twice",
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
	{Name: "kill-one", Class: "crash", Doc: "SIGKILL one random follower, restart it",
		Expect: map[string]int{"restarts": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.killRestart(ctx, []int{f}, faultFor)
		}},
	{Name: "kill-minority", Class: "crash", Doc: "SIGKILL two random nodes (a minority of five), restart them",
		Expect: map[string]int{"restarts": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			perm := e.Rng.Perm(e.C.Size())
			return e.killRestart(ctx, perm[:(e.C.Size()-1)/2], faultFor)
		}},
	{Name: "kill-all", Class: "crash", Nodes: 3, Doc: "SIGKILL every node at once and restart them: acknowledged grants and fences survive",
		Expect: map[string]int{"restarts": 3},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.killRestart(ctx, e.Others(), 2*time.Second)
		}},
	{Name: "truncate-restart", Liveness: true, Class: "crash", Doc: "cut the leader off while clients still reach it (its log gains entries the others never commit), heal (it drops them for the new leader's), then SIGKILL and restart it: a server must read back a log whose end it cut",
		Expect: map[string]int{"leader-changes": 1, "restarts": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			if err := e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone", l), faultFor,
				func() error { return e.C.Partition([][]int{{l}, e.Others(l)}) }, e.C.Heal); err != nil {
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
	{Name: "pause-leader-long", Class: "pause", Nodes: 3,
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
	{Name: "clock-jump-leader", Class: "clock", Doc: "the leader's wall clock jumps +5 min, -10 min, then strobes",
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
			}
			e.H.Note(Event{Type: "nemesis", Name: "clock", Phase: "stop", Detail: fmt.Sprintf("leader %d wall clock", l)})
			return nil
		}},
	{Name: "clock-rate-leader", Class: "clock", Eps: 0.05, Doc: "the leader's monotonic clock runs at 0.5x, then at 1.04x (within the 5% the holders allow)",
		Nemesis: func(ctx context.Context, e *Env) error {
			for _, r := range []float64{0.5, 1.04} {
				l, err := e.WaitLeader(ctx, 10*time.Second)
				if err != nil {
					return err
				}
				if err := e.Fault(ctx, "clock-rate", fmt.Sprintf("leader %d at %.2fx", l, r), faultFor/2,
					func() error { return e.C.ClockRate(l, r) }, func() error { return e.C.ClockRate(l, 1) }); err != nil {
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
		Doc: "one follower's every disk write takes 200 ms longer, another's 50 ms, for 8 s",
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			perm := e.Rng.Perm(len(fs))
			a, b := fs[perm[0]], fs[perm[1]]
			return e.Fault(ctx, "disk-slow", fmt.Sprintf("follower %d +200ms, follower %d +50ms per write", a, b), 8*time.Second,
				func() error {
					if err := e.C.DiskFault(a, false, 200*time.Millisecond); err != nil {
						return err
					}
					return e.C.DiskFault(b, false, 50*time.Millisecond)
				}, func() error { return errors.Join(e.C.DiskFault(a, false, 0), e.C.DiskFault(b, false, 0)) })
		}},
	{Name: "disk-stall-majority", Class: "disk", Liveness: true,
		Doc: "the disks of a majority (the leader and two followers) stall for 8 s: nothing commits; once healed the clock must resume within the liveness bound",
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
			return e.FaultNoQuorum(ctx, "disk-stall", fmt.Sprintf("nodes %v", nodes), 8*time.Second, set(true), set(false))
		}},
	{Name: "transfer-storm", Class: "transfer", Doc: "for 8 s, leadership moves on right after each tick (the tick-compression trap: a new leader that ticks at once runs the clock fast)",
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
	{Name: "remove-leader", Class: "membership", Doc: "remove the leader from the cluster, then wipe it and let it rejoin as a new server",
		Expect: map[string]int{"leader-changes": 1, "removals": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			return e.removeAndRejoin(ctx, l, false)
		}},
	{Name: "remove-partitioned", Class: "membership", Doc: "partition a follower off, remove it, heal, wipe it and let it rejoin",
		Expect: map[string]int{"removals": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
			return e.removeAndRejoin(ctx, f, true)
		}},
	{Name: "snapshot-catchup", Class: "snapshot", SnapshotThreshold: 64,
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
	{Name: "wiped-node", Class: "wipe", Doc: "a follower is killed and its data directory wiped; it is removed and rejoins empty",
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

// wipeRestartOriginal kills and wipes node n, pauses every other node,
// restarts n with its original command, resumes the others after d, then
// waits until another node has seen n leave the voters (the leader removes
// the old member) and come back as a healthy voter, and n serves.
func (e *Env) wipeRestartOriginal(ctx context.Context, n int, d time.Duration) error {
	others := e.Others(n)
	// Pausing first: a tier that cannot pause is skipped before anything
	// is broken.
	if err := e.C.Pause(others[0]); err != nil {
		return err
	}
	paused := []int{others[0]}
	resume := func() error {
		var first error
		for _, o := range paused {
			if err := e.C.Resume(o); err != nil && first == nil {
				first = err
			}
		}
		paused = nil
		return first
	}
	defer resume()
	if err := e.C.Wipe(n); err != nil {
		return err
	}
	e.Count("wipes", 1)
	e.Note("wipe", fmt.Sprintf("node %d killed, data wiped", n), nil)
	for _, o := range others[1:] {
		if err := e.C.Pause(o); err != nil {
			return err
		}
		paused = append(paused, o)
	}
	err := e.Fault(ctx, "pause", fmt.Sprintf("nodes %v while node %d restarts wiped", others, n), d, func() error {
		if err := e.C.Restart(n); err != nil {
			return err
		}
		e.Count("restarts", 1)
		return nil
	}, resume)
	if err != nil {
		return err
	}
	id := e.C.NodeID(n)
	deadline := time.Now().Add(60 * time.Second)
	last := "no answer"
	replaced := false
	for {
		for _, o := range others {
			st, err := e.Admin(o).Cluster(ctx)
			if err != nil {
				last = err.Error()
				continue
			}
			for _, m := range st.Members {
				if m.ID != id {
					continue
				}
				last = fmt.Sprintf("node %d sees %s as voter=%v health=%s", o, id, m.Voter, m.Health)
				if !m.Voter {
					replaced = true // removed, or added back as a non-voter
				}
				if !replaced || !m.Voter || m.Health != "healthy" {
					continue
				}
				// Back as a voter after the replacement, and serving its own
				// state.
				if ls, err := e.Local(ctx, n, 0, time.Second); err != nil || ls.AppliedIndex == 0 {
					last = fmt.Sprintf("%s is a voter but its local state: %v", id, err)
					continue
				}
				e.Count("wiped-rejoined", 1)
				e.Note("rejoined", last, nil)
				return nil
			}
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("node %d did not rejoin as a voter within 60 s: %s", n, last)
			e.Note("rejoined", id, err)
			return err
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// killRestart kills the nodes, waits d and restarts them.
func (e *Env) killRestart(ctx context.Context, nodes []int, d time.Duration) error {
	return e.Fault(ctx, "kill", fmt.Sprintf("nodes %v", nodes), d, func() error {
		for _, n := range nodes {
			if err := e.C.Kill(n); err != nil {
				return err
			}
		}
		return nil
	}, func() error {
		for _, n := range nodes {
			if err := e.C.Restart(n); err != nil {
				return err
			}
			e.Count("restarts", 1)
		}
		return nil
	})
}

// removeAndRejoin removes node n through the leader (partitioning it off
// first if asked), then wipes it and brings it back as a new server.
func (e *Env) removeAndRejoin(ctx context.Context, n int, partition bool) error {
	if partition {
		if err := e.C.Partition([][]int{{n}, e.Others(n)}); err != nil {
			return err
		}
		e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "start", Detail: fmt.Sprintf("node %d alone", n)})
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	if err := e.remove(ctx, n); err != nil {
		return err
	}
	if partition {
		if err := e.C.Heal(); err != nil {
			return err
		}
		e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "stop", Detail: fmt.Sprintf("node %d alone", n)})
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	if err := e.C.Wipe(n); err != nil {
		return err
	}
	e.Count("wipes", 1)
	return e.rejoinWiped(ctx, n, false)
}

// remove asks the current leader (other than n) to remove node n, retrying
// through leader changes.
func (e *Env) remove(ctx context.Context, n int) error {
	id := e.C.NodeID(n)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if l := e.Leader(ctx); l >= 0 {
			err = e.Admin(l).RemoveMember(ctx, id)
			if err == nil {
				e.Count("removals", 1)
				e.Note("remove", fmt.Sprintf("node %d (%s) via node %d", n, id, l), nil)
				return nil
			}
		}
		if time.Now().After(deadline) {
			e.Note("remove", fmt.Sprintf("node %d (%s)", n, id), err)
			return fmt.Errorf("remove node %d: %v", n, err)
		}
		if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
			return err
		}
	}
}

// rejoinWiped removes the wiped node's old membership if asked (the
// product refuses a wiped server under a current member's id) and restarts
// it empty; it joins as a new server.
func (e *Env) rejoinWiped(ctx context.Context, n int, remove bool) error {
	if remove {
		if err := e.remove(ctx, n); err != nil {
			return err
		}
	}
	if err := e.C.Restart(n); err != nil {
		return err
	}
	e.Count("restarts", 1)
	e.Note("restart", fmt.Sprintf("node %d empty", n), nil)
	return nil
}
