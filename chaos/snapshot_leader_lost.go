package chaos

import (
	"context"
	"fmt"
	"time"
)

// A leader lost mid-snapshot without a word: a follower receiving the
// leader's snapshot over a throttled link, and the leader cut off from
// every peer (its packets dropped, so no FIN or RST of its connections
// ever reaches the follower) and then killed. Killing a process closes its
// sockets, which the follower hears about (snapshot-install-interrupted);
// a leader that loses its network, or its power, says nothing: the
// follower's connection goes silent in the middle of the snapshot. With
// three nodes the two left need each other for a majority, the follower
// that was receiving included: it must give the silent transfer up, vote,
// and catch up from the new leader, while the old one stays cut off.

// leaderLostBound is how soon after the cut a new leader must commit and
// the follower must have applied up to its commit index (the scenario's
// liveness bound too).
const leaderLostBound = wideStall

// leaderLostHold is how long the cut and the throttle (whose proxy holds
// the follower's side of the silent connection open) last at most while
// the follower is waited for: past leaderLostBound, so that a follower
// stuck for good fails the liveness checker, not just the nemesis.
const leaderLostHold = leaderLostBound + 15*time.Second

func init() {
	builtin = append(builtin, &Scenario{Name: "snapshot-install-leader-lost", Class: "snapshot", Nodes: 3, SnapshotThreshold: 64,
		Liveness: true, StallBound: leaderLostBound, Configuration: true,
		Doc: "the state padded to 40,000 leases (a 4.5 MB snapshot); a follower cut off until the leader compacts past it, healed behind a link " +
			"throttled so that the snapshot takes about 8 s: once 64 KiB have arrived, the leader is cut off from every peer (packets dropped: " +
			"no FIN or RST reaches the follower) and killed; the two left (the receiving follower needed for a majority) must elect a leader, " +
			"and the follower apply up to its commit index, within 20 s, the old leader still cut off; real processes only",
		Expect: map[string]int{"installs-cut-leader-lost": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			th, err := e.paddedForInstall(ctx)
			if err != nil {
				return err
			}
			return e.installLeaderLost(ctx, th)
		}})
}

// installLeaderLost starts a throttled install (throttledInstall), then
// cuts the leader off from every peer and, 1.5 s later, kills it. The
// effect ("installs-cut-leader-lost") counts when the follower held part
// of the snapshot, not all, at the cut, and its part stood still for the
// last second before the kill (the leader still running: the cut
// stopped it), with no install completed. Then, the cut and the throttle still in force, it waits (up
// to leaderLostHold) for a leader among the others and the follower to
// have applied up to that leader's commit index; it heals, restarts the
// old leader, and fails if that took longer than leaderLostBound.
func (e *Env) installLeaderLost(ctx context.Context, th throttler) error {
	in, err := e.throttledInstall(ctx, th)
	if err != nil {
		return err
	}
	l, f, snap := in.l, in.f, in.snap
	fDir := e.C.DataDir(f)
	var cutAt time.Time
	partialAtCut, stoodStill := false, false
	usable := time.Duration(-1)
	var last string
	detail := fmt.Sprintf("leader %d cut off from every peer (no FIN or RST reaches follower %d) and killed while follower %d receives snapshot %d",
		l, f, f, snap.Index)
	err = e.Fault(ctx, "leader-lost", detail, 0,
		func() error {
			if err := e.C.Partition([][]int{{l}, e.Others(l)}); err != nil {
				return err
			}
			cutAt = time.Now()
			name, now := receiving(fDir, in.before.LastIndex)
			partialAtCut = name == in.name && now < snap.Size
			e.Note("install-at-cut", fmt.Sprintf("follower %d had %d of %d bytes of snapshot %d (%s)", f, now, snap.Size, snap.Index, in.name), nil)
			return nil
		}, func() error {
			// What the proxy had read from the leader arrives within a
			// fraction of a second; after that, with the leader still
			// running, the transfer stands still only if the cut landed
			// (throttled, it moves an eighth of the snapshot a second).
			if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
				return err
			}
			_, drained := receiving(fDir, in.before.LastIndex)
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
			name, now := receiving(fDir, in.before.LastIndex)
			ls, lerr := e.Local(ctx, f, 0, time.Second)
			stoodStill = name == in.name && now == drained && now < snap.Size && lerr == nil && ls.SnapshotsInstalled == in.before.SnapshotsInstalled
			if err := e.C.Kill(l); err != nil {
				return err
			}
			e.Note("install-at-kill", fmt.Sprintf("leader %d killed, cut off; follower %d had %d of %d bytes of snapshot %d (%s; %d a second before), installs %v",
				l, f, now, snap.Size, snap.Index, name, drained, installsOf(ls, lerr)), nil)
			for usable < 0 && time.Since(cutAt) < leaderLostHold {
				last = e.followerCaughtUp(ctx, f, l)
				if last == "" {
					usable = time.Since(cutAt)
					break
				}
				if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
					return err
				}
			}
			if usable >= 0 {
				e.Note("follower-usable", fmt.Sprintf("follower %d caught up with a new leader %.1f s after leader %d was cut off",
					f, usable.Seconds(), l), nil)
			} else {
				e.Note("follower-usable", fmt.Sprintf("follower %d not caught up %.0f s after leader %d was cut off: %s",
					f, leaderLostHold.Seconds(), l, last), nil)
			}
			if err := th.Throttle(l, f, 0); err != nil {
				return err
			}
			if err := e.C.Partition([][]int{e.Others()}); err != nil {
				return err
			}
			if err := e.C.Restart(l); err != nil {
				return err
			}
			e.Count("restarts", 1)
			return nil
		})
	if err != nil {
		return err
	}
	if partialAtCut && stoodStill {
		e.Count("installs-cut-leader-lost", 1)
	}
	switch {
	case usable < 0:
		return fmt.Errorf("follower %d was not usable again within %v of leader %d's loss mid-snapshot (bound %v): %s",
			f, leaderLostHold, l, leaderLostBound, last)
	case usable > leaderLostBound:
		return fmt.Errorf("follower %d was usable again %.1f s after leader %d's loss mid-snapshot (bound %v)",
			f, usable.Seconds(), l, leaderLostBound)
	}
	// The old leader back: it must catch up too before the checkers run.
	return e.waitCaughtUp(ctx, l, 60*time.Second)
}

// installsOf is a node's count of installed snapshots, for a note.
func installsOf(ls *LocalState, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(ls.SnapshotsInstalled)
}

// followerCaughtUp is "" when a node other than old leads and follower f
// has applied up to that leader's commit index; else what is missing.
func (e *Env) followerCaughtUp(ctx context.Context, f, old int) string {
	nl := e.Leader(ctx)
	if nl < 0 || nl == old {
		return "no new leader"
	}
	ll, err := e.Local(ctx, nl, 0, time.Second)
	if err != nil {
		return err.Error()
	}
	fl, err := e.Local(ctx, f, 0, time.Second)
	if err != nil {
		return err.Error()
	}
	if fl.AppliedIndex < ll.CommitIndex {
		return fmt.Sprintf("leader %d committed %d, follower %d applied %d", nl, ll.CommitIndex, f, fl.AppliedIndex)
	}
	return ""
}

// waitCaughtUp waits up to d for node n to have applied up to the
// leader's commit index.
func (e *Env) waitCaughtUp(ctx context.Context, n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		last := e.followerCaughtUp(ctx, n, -1)
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d did not catch up within %v: %s", n, d, last)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}
