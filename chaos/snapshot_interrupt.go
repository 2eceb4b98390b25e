package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Interrupted snapshot installs: a follower far behind receives the
// leader's snapshot over a throttled link (seconds for the whole), and a
// kill cuts the transfer in the middle; afterwards it must catch up.

// padInterrupted leases make the snapshot about 4.5 MB: more than a TCP
// send buffer grows to here (net.ipv4.tcp_wmem's maximum, 4 MiB), so a
// leader killed once interruptAfter bytes have arrived cannot have handed
// the rest to its kernel (which goes on sending what it holds after the
// process died): the follower's read comes up short.
const (
	padInterrupted = 40_000
	interruptAfter = 64 << 10
)

// throttler is a Cluster that can cap the bytes one node sends another
// over Raft (NetnsCluster, through its delay proxy).
type throttler interface {
	Throttle(from, to int, bytesPerSec int64) error
}

func init() {
	builtin = append(builtin, &Scenario{Name: "snapshot-install-interrupted", Class: "snapshot", Nodes: 3, SnapshotThreshold: 64,
		Liveness: true, StallBound: wideStall, Configuration: true,
		Doc: "the state padded to 40,000 leases (a 4.5 MB snapshot); a follower cut off until the leader compacts past it, healed behind a link " +
			"throttled so that the snapshot takes about 8 s: once 64 KiB have arrived, the follower is killed; the next time the leader is killed " +
			"(a new leader sends it again); each time the follower must catch up; real processes only",
		Expect: map[string]int{"installs-interrupted-follower-kill": 1, "installs-interrupted-leader-kill": 1, "installs-completed": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			th, err := e.paddedForInstall(ctx)
			if err != nil {
				return err
			}
			for _, kill := range []string{"follower", "leader"} {
				if err := e.interruptInstall(ctx, th, kill); err != nil {
					return err
				}
			}
			return nil
		}})
}

// snapMeta is what the harness reads of a snapshot directory.
type snapMeta struct {
	Index uint64
	Size  int64
}

// newestSnapshot is the newest complete snapshot in node i's data
// directory.
func newestSnapshot(dir string) (snapMeta, bool) {
	ents, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	var best snapMeta
	found := false
	for _, ent := range ents {
		if !ent.IsDir() || strings.HasSuffix(ent.Name(), ".tmp") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "snapshots", ent.Name(), "meta.json"))
		if err != nil {
			continue
		}
		var m snapMeta
		if json.Unmarshal(b, &m) == nil && m.Index >= best.Index {
			best, found = m, true
		}
	}
	return best, found
}

var snapNameRe = regexp.MustCompile(`^\d+-(\d+)-\d+\.tmp$`)

// receiving is the snapshot node's data directory is receiving (a
// directory still named .tmp) of an index above after: its name and the
// bytes it holds so far.
func receiving(dir string, after uint64) (string, int64) {
	ents, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	for _, ent := range ents {
		m := snapNameRe.FindStringSubmatch(ent.Name())
		if m == nil {
			continue
		}
		if idx, _ := strconv.ParseUint(m[1], 10, 64); idx <= after {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "snapshots", ent.Name(), "state.bin")); err == nil {
			return ent.Name(), fi.Size()
		}
	}
	return "", 0
}

// logSize is the length of node i's log now: what it logs later starts
// there.
func logSize(c Cluster, i int) int64 {
	fi, err := os.Stat(c.LogPath(i))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// loggedSince reports whether node i's log, past offset, has a line that
// contains every one of parts.
func loggedSince(c Cluster, i int, offset int64, parts ...string) bool {
	b, err := os.ReadFile(c.LogPath(i))
	if err != nil || int64(len(b)) < offset {
		return false
	}
	for _, line := range strings.Split(string(b[offset:]), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// interruptInstall makes a follower fall behind the leader's log, heals it
// behind a throttled link from the leader, waits until interruptAfter
// bytes of the snapshot have arrived, and kills the follower (kill "follower") or the
// leader ("leader"). The interruption counts ("installs-interrupted-<kill>
// -kill") only when the follower held part of the snapshot, not all, at
// the kill, and the failed transfer shows in a log afterwards: the
// leader's "failed to install snapshot" for the follower, or the
// follower's short read. Then the follower must catch up (applied up to
// the leader's commit index) with a completed install
// ("installs-completed").
func (e *Env) interruptInstall(ctx context.Context, th throttler, kill string) error {
	in, err := e.throttledInstall(ctx, th)
	if err != nil {
		return err
	}
	l, f, before, snap, name := in.l, in.f, in.before, in.snap, in.name
	fDir, lOff, fOff := e.C.DataDir(f), in.lOff, in.fOff
	victim := f
	if kill == "leader" {
		victim = l
	}
	partial, failed := false, false
	// The failed transfer must show while the throttle is still in force:
	// lifting it closes the proxied connections, which would cut a
	// transfer that the kill left alone. Without a kill the rest arrives
	// within about 6 s and nothing fails.
	err = e.Fault(ctx, "kill", fmt.Sprintf("%s %d while follower %d receives snapshot %d", kill, victim, f, snap.Index), 0,
		func() error {
			if err := e.C.Kill(victim); err != nil {
				return err
			}
			name2, now := receiving(fDir, before.LastIndex)
			partial = name2 == name && now < snap.Size
			e.Note("install-at-kill", fmt.Sprintf("follower %d had %d of %d bytes of snapshot %d (%s)", f, now, snap.Size, snap.Index, name), nil)
			return nil
		}, func() error {
			for end := time.Now().Add(8 * time.Second); !failed && time.Now().Before(end); {
				if kill == "follower" {
					failed = loggedSince(e.C, l, lOff, `msg="failed to install snapshot"`, "peer="+e.C.NodeID(f))
				} else {
					failed = loggedSince(e.C, f, fOff, "failed to receive whole snapshot") || loggedSince(e.C, f, fOff, "failed to copy snapshot")
				}
				if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
					return err
				}
			}
			if err := th.Throttle(l, f, 0); err != nil {
				return err
			}
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
			if err := e.C.Restart(victim); err != nil {
				return err
			}
			e.Count("restarts", 1)
			return nil
		})
	if err != nil {
		return err
	}
	e.Note("install-interrupted", fmt.Sprintf("%s killed: partial at the kill %v, the failed transfer logged (throttle still on) %v", kill, partial, failed), nil)
	if partial && failed {
		e.Count("installs-interrupted-"+kill+"-kill", 1)
	}
	// Caught up: applied up to what the leader had committed once healed.
	deadline := time.Now().Add(60 * time.Second)
	for {
		nl := e.Leader(ctx)
		var target uint64
		if nl >= 0 {
			if ls, err := e.Local(ctx, nl, 0, time.Second); err == nil {
				target = ls.CommitIndex
			}
		}
		ls, err := e.Local(ctx, f, 0, time.Second)
		if err == nil && target > 0 && ls.AppliedIndex >= target {
			done := ls.SnapshotsInstalled > before.SnapshotsInstalled || (kill == "follower" && ls.SnapshotsInstalled > 0)
			if done {
				e.Count("installs-completed", 1)
			}
			e.Note("caught-up", fmt.Sprintf("follower %d applied %d (leader %d committed %d), snapshots installed since its start %d",
				f, ls.AppliedIndex, nl, target, ls.SnapshotsInstalled), nil)
			return sleepCtx(ctx, 2*time.Second)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("follower %d did not catch up within 60 s of the interrupted install: %v", f, err)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// install is a snapshot transfer under way to a follower behind a
// throttled link (throttledInstall).
type install struct {
	l, f       int         // the leader sending, the follower receiving
	before     *LocalState // the follower's view before it was cut off
	snap       snapMeta    // the leader's snapshot being sent
	name       string      // its .tmp directory on the follower
	lOff, fOff int64       // the leader's and follower's log sizes at the heal
}

// throttledInstall makes a follower fall behind the leader's log (cut off
// until the leader's newest snapshot is 64 entries past it), heals it
// behind a link from the leader throttled so that the snapshot takes about
// 8 s, and waits until interruptAfter bytes of it have arrived (the
// follower's snapshots/*.tmp). The throttle stays on.
func (e *Env) throttledInstall(ctx context.Context, th throttler) (*install, error) {
	l, err := e.WaitLeader(ctx, 15*time.Second)
	if err != nil {
		return nil, err
	}
	fs := e.Others(l)
	f := fs[e.Rng.IntN(len(fs))]
	before, err := e.Local(ctx, f, 0, time.Second)
	if err != nil {
		return nil, err
	}
	lDir, fDir := e.C.DataDir(l), e.C.DataDir(f)
	if err := e.C.Partition([][]int{{f}, e.Others(f)}); err != nil {
		return nil, err
	}
	e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "start", Detail: fmt.Sprintf("follower %d alone until the leader compacts past it", f)})
	var snap snapMeta
	deadline := time.Now().Add(60 * time.Second)
	for {
		var ok bool
		if snap, ok = newestSnapshot(lDir); ok && snap.Index > before.LastIndex+64 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("leader %d took no snapshot past index %d within 60 s (newest: %d)", l, before.LastIndex+64, snap.Index)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	rate := max(snap.Size/8, 4096)
	if err := th.Throttle(l, f, rate); err != nil {
		return nil, err
	}
	lOff, fOff := logSize(e.C, l), logSize(e.C, f)
	// One group: the partition ends, the throttle stays.
	if err := e.C.Partition([][]int{e.Others()}); err != nil {
		return nil, err
	}
	e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "stop",
		Detail: fmt.Sprintf("follower %d alone until the leader compacts past it; leader %d -> it throttled to %d B/s (snapshot %d: %d bytes)", f, l, rate, snap.Index, snap.Size)})
	var name string
	var got int64
	deadline = time.Now().Add(30 * time.Second)
	for {
		if name, got = receiving(fDir, before.LastIndex); name != "" && got >= interruptAfter {
			break
		}
		if ls, err := e.Local(ctx, f, 0, time.Second); err == nil && ls.SnapshotsInstalled > before.SnapshotsInstalled {
			return nil, fmt.Errorf("follower %d installed the snapshot before %d bytes of it were seen arriving", f, interruptAfter)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("follower %d received no %d bytes of snapshot %d within 30 s (%q: %d bytes)", f, interruptAfter, snap.Index, name, got)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return &install{l: l, f: f, before: before, snap: snap, name: name, lOff: lOff, fOff: fOff}, nil
}

// paddedForInstall pads the state to padInterrupted leases through a
// restore, so that a snapshot takes seconds over a throttled link, and
// returns the tier's throttler (real processes only).
func (e *Env) paddedForInstall(ctx context.Context) (throttler, error) {
	th, ok := e.C.(throttler)
	if !ok {
		return nil, fmt.Errorf("chaos: the %s tier cannot throttle a link: %w", e.Tier, ErrUnsupported)
	}
	file, restored, err := e.paddedSnapshot(ctx, padInterrupted)
	if err != nil {
		return nil, err
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := e.restoreAttempt(ctx, l, file, restored, time.Minute); err != nil {
		return nil, fmt.Errorf("pad the state: %w", err)
	}
	return th, nil
}
