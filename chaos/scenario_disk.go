package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The disk class of the built-in scenarios (scenario_table.go assembles them).

// diskStallScenarios stall or slow nodes' disks.
var diskStallScenarios = []*Scenario{
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
}

// diskFullScenarios fill nodes' disks and flip bits in what they wrote.
var diskFullScenarios = []*Scenario{
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
}
