package chaos

import (
	"context"
)

// Scenarios of faults below Raft and the clock that operators meet: rot in
// a payload only the checksum sees, disk errors, duplicated and reordered
// Raft messages, clock faults on a follower that later leads.

func init() { builtin = append(builtin, faultScenarios...) }

var faultScenarios = []*Scenario{
	{Name: "clock-follower-leads", Class: "clock", Liveness: true, StallBound: wideStall, Eps: 0.05,
		Doc: "a follower's wall clock jumps +5 min and its monotonic clock runs at 1.04x, then leadership is handed to it: a grant it stamps shows the jump, " +
			"while expiry follows the ticks it issues and every lease keeps its remaining time across the hand-over; still leading, " +
			"its clock jumps back 10 min and slows to 0.5x, then leadership moves on",
		Expect: map[string]int{"clock-jumps": 2, "clock-jump-seen": 1, "faulty-clock-led": 1, "leader-changes": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.clockFollowerLeads(ctx)
		}},
	{Name: "disk-error", Class: "disk", Nodes: 3, LazyDisk: true, Liveness: true, StallBound: wideStall,
		Doc: "the leader's disk fails every write and fsync with EIO for 5 s, then the next leader's with ENOSPC (reading as full) for 5 s, " +
			"then a follower's with EIO for 4 s (boltdb log): each reports it on /healthz or exits with status 74, and is healthy again within 30 s " +
			"(restarted after an exit, as by a supervisor); nothing acknowledged is lost; real processes only (a lazy filesystem)",
		Expect: map[string]int{"disk-errors-injected": 3, "disk-error-reported": 3, "disk-error-recovered": 3, "leader-changes": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.diskErrors(ctx)
		}},
	{Name: "disk-error-wal", Class: "disk", Nodes: 3, LazyDisk: true, Liveness: true, StallBound: wideStall, RaftLog: "wal",
		Doc:    "disk-error with the raft-wal log store (--raft-log wal)",
		Expect: map[string]int{"disk-errors-injected": 3, "disk-error-reported": 3, "disk-error-recovered": 3, "leader-changes": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.diskErrors(ctx)
		}},
	{Name: "bitflip-payload", Class: "disk", Nodes: 3,
		Doc: "a follower is killed and one bit of a key flips in each of its 5 latest commands (the entries still decode: only their checksum " +
			"tells); restarted, it must refuse them by their checksum (its log says so), never serve as ready a state built on them, " +
			"and it is then wiped and rejoins; real processes only",
		Expect: map[string]int{"payload-flips": 1, "bitflip-payload-refused": 1, "bitflip-payload-checksum": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.bitflipPayload(ctx)
		}},
	{Name: "raft-dup-reorder", Liveness: true, StallBound: wideStall, Class: "network", SnapshotThreshold: 64,
		Doc: "Raft requests are sent again (appends 30%, votes and pre-votes 60%, every snapshot install), half of the copies up to 300 ms late, " +
			"after later ones; meanwhile a follower is cut off until the leader compacts past it (it catches up by a snapshot install), " +
			"and leadership is handed on twice (a transfer may time out); in-process tier only (it wraps Raft's transport)",
		Expect: map[string]int{"append-duplicated": 1, "append-reordered": 1, "vote-duplicated": 1, "snapshot-duplicated": 1,
			"snapshots-installed": 1, "leader-changes": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			return e.raftDupReorder(ctx)
		}},
}
