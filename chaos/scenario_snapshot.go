package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// The snapshot and restore classes of the built-in scenarios (scenario_table.go
// assembles them).

// snapshotScenarios make a follower catch up by snapshot.
var snapshotScenarios = []*Scenario{
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
}

// restoreScenarios restore a saved snapshot into a running cluster.
var restoreScenarios = []*Scenario{
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
}
