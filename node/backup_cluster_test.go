package node

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestClusterSnapshotRestore: a restore on the leader reaches every
// follower, keeps the member registry and the leases live before it, and
// fencing tokens stay above every earlier one after a failover too.
func TestClusterSnapshotRestore(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	kept, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, l)
	for i := range 20 {
		if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("later/", i), Holder: "w2", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Release(ctx, wire.ReleaseRequest{LeaseID: kept.LeaseID, Token: kept.Token}); err != nil {
		t.Fatal(err)
	}
	maxBefore := l.fenceForTest()

	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			if _, err := n.RestoreSnapshot(ctx, bytes.NewReader(file)); wire.ErrorCode(err) != wire.CodeNoLeader {
				t.Fatalf("restore on follower %s: %v", id, err)
			}
			if _, err := n.SaveSnapshot(ctx, &bytes.Buffer{}); wire.ErrorCode(err) != wire.CodeNoLeader {
				t.Fatalf("save on follower %s: %v", id, err)
			}
		}
	}
	info, err := l.RestoreSnapshot(ctx, bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		n := c.node(id)
		waitFor(t, 10*time.Second, func() bool {
			got, err := n.GetLease(ctx, kept.LeaseID, true)
			list, _ := n.ListLeases(ctx, wire.ListRequest{Prefix: "later/", State: "active"}, true)
			return err == nil && got.State == "active" && got.FencingToken > maxBefore && list != nil && len(list.Leases) == 20 &&
				n.AppliedIndex() >= info.RestoredIndex-1
		})
		rec, ok := l.rc.memberRecord(id)
		if !ok || rec.Removed {
			t.Fatalf("member registry lost %s after the restore: %+v %v", id, rec, ok)
		}
	}
	oldID := l.cfg.NodeID
	c.stop(oldID)
	nl := c.leader(oldID)
	restored, err := nl.GetLease(ctx, kept.LeaseID, false)
	if err != nil || restored.State != "active" || restored.FencingToken <= maxBefore {
		t.Fatalf("restored lease on the new leader: %v %+v", err, restored)
	}
	l2, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "new/0", Holder: "w3", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken <= restored.FencingToken {
		t.Fatalf("fencing token %d on the new leader after the restore; %d was granted before", l2.FencingToken, restored.FencingToken)
	}
}

// TestClusterRestoreLostToAnotherLeader: the leader starts a restore and is
// cut off (right after its first chunk, or after every chunk committed,
// just before its commit); another server leads the next term and writes.
// The restore is not reported done, and once healed every server ends with
// the cluster's state (the old leader's too), identical on all three. (With
// raft.Restore, the old leader kept a restored state nobody else had and
// rejected every append at the index Restore burned.)
func TestClusterRestoreLostToAnotherLeader(t *testing.T) {
	for _, step := range []string{"first-chunk", "chunks-sent"} {
		t.Run(step, func(t *testing.T) {
			c := threeNodes(t)
			ctx := context.Background()
			l := c.leader()
			a, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "a/1", Holder: "w1", TTLMS: 600000})
			if err != nil {
				t.Fatal(err)
			}
			file, _ := saveSnapshot(t, l)
			if _, err := l.Release(ctx, wire.ReleaseRequest{LeaseID: a.LeaseID, Token: a.Token}); err != nil {
				t.Fatal(err)
			}
			l.bk.onRestoreStep = func(s string) {
				if s == step {
					c.isolate(l.cfg.NodeID)
				}
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, rerr := l.RestoreSnapshot(rctx, bytes.NewReader(file))
			cancel()
			t.Logf("restore on the cut-off leader: %v", rerr)
			if rerr == nil {
				t.Fatal("the restore was reported done, yet its leader was cut off before the cluster had it")
			}
			if code := wire.ErrorCode(rerr); code != wire.CodeNoLeader && code != wire.CodeUnavailable && code != wire.CodeIndeterminate {
				t.Fatalf("restore answered %v", rerr)
			}
			nl := c.leader(l.cfg.NodeID)
			b, _, err := nl.Acquire(ctx, wire.AcquireRequest{Key: "b/1", Holder: "w2", TTLMS: 600000})
			if err != nil {
				t.Fatal(err)
			}
			c.heal()
			var last string
			deadline := time.Now().Add(60 * time.Second)
			for {
				got, err := l.GetLease(ctx, a.LeaseID, true)
				gb, errb := l.GetLease(ctx, b.LeaseID, true)
				if err == nil && errb == nil && got.State == "released" && gb.State == "active" {
					break
				}
				last = fmt.Sprintf("a/1: %v %v; b/1: %v %v", stateOf(got), err, stateOf(gb), errb)
				if time.Now().After(deadline) {
					t.Fatalf("the old leader never converged to the cluster's state: %s", last)
				}
				time.Sleep(50 * time.Millisecond)
			}
			sameState(t, l, nl)
			for _, id := range []string{"n1", "n2", "n3"} {
				sameState(t, nl, c.node(id))
			}
		})
	}
}

func stateOf(l *wire.Lease) string {
	if l == nil {
		return "-"
	}
	return l.State
}

// TestClusterRestoreOutlastsWatchdog: a restore whose commit takes longer
// to apply than the leadership watchdog's stall bound (a large state: about
// a million leases took more than the 3 s bound) completes without the
// leader giving up leadership: ticks wait behind the apply, and the
// watchdog counts the restore as progress.
func TestClusterRestoreOutlastsWatchdog(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	a, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "a/1", Holder: "w1", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, l)
	if _, err := l.Release(ctx, wire.ReleaseRequest{LeaseID: a.LeaseID, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	stall := l.cfg.leaderStall() + l.cfg.leaderStall()/2
	hook := func() { time.Sleep(stall) } // the slow apply under test
	restoreApplyHook.Store(&hook)
	t.Cleanup(func() { restoreApplyHook.Store(nil) })
	info, err := l.RestoreSnapshot(ctx, bytes.NewReader(file))
	restoreApplyHook.Store(nil)
	if err != nil {
		t.Fatalf("restore with a commit that applies for %v: %v", stall, err)
	}
	// (A loaded machine may still lose a leader to late heartbeats; the
	// watchdog is what must not give it up.)
	if n := l.cl.WatchdogStepDowns(); n != 0 {
		t.Fatalf("the watchdog gave leadership up %d times during the restore", n)
	}
	// (Its own state, read locally: three servers stalled in the apply for
	// seconds may have held an election since.)
	if got, err := l.GetLease(ctx, a.LeaseID, true); err != nil || got.State != "active" {
		t.Fatalf("the file's lease after the restore at %d: %v %+v", info.RestoredIndex, err, got)
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			sameState(t, l, n)
		}
	}
}
