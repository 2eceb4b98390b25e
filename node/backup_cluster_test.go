package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestClusterSnapshotRestore: a restore on the leader reaches every
// follower, keeps the member registry and the leases live before it, and
// fencing tokens stay above every earlier one after a failover too.
func TestClusterSnapshotRestore(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	kept, _, err := l.Acquire(ctx, AcquireRequest{Key: "cam/1", Holder: "w1", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, l)
	for i := range 20 {
		if _, _, err := l.Acquire(ctx, AcquireRequest{Key: fmt.Sprint("later/", i), Holder: "w2", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Release(ctx, ReleaseRequest{LeaseID: kept.LeaseID, Token: kept.Token}); err != nil {
		t.Fatal(err)
	}
	maxBefore := l.fenceForTest()

	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			if _, err := n.RestoreSnapshot(ctx, bytes.NewReader(file)); ErrorCode(err) != CodeNoLeader {
				t.Fatalf("restore on follower %s: %v", id, err)
			}
			if _, err := n.SaveSnapshot(ctx, &bytes.Buffer{}); ErrorCode(err) != CodeNoLeader {
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
			list, _ := n.ListLeases(ctx, ListRequest{Prefix: "later/", State: "active"}, true)
			return err == nil && got.State == "active" && got.FencingToken > maxBefore && list != nil && len(list.Leases) == 20 &&
				n.AppliedIndex() >= info.RestoredIndex-1
		})
		rec, ok := l.memberRecord(id)
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
	l2, _, err := nl.Acquire(ctx, AcquireRequest{Key: "new/0", Holder: "w3", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken <= restored.FencingToken {
		t.Fatalf("fencing token %d on the new leader after the restore; %d was granted before", l2.FencingToken, restored.FencingToken)
	}
}

// TestClusterRestoreLostToAnotherLeader: the leader installs a restore and
// is cut off before any follower has it; another server leads the next
// term and writes. Once healed, the old leader must end with the cluster's
// state, not the restored one it alone installed.
//
// KNOWN GAP, skipped unless LEASEHOLD_KNOWN_GAPS=1: it fails today. Raft's
// Restore installs the state on the leader before any other server has it
// and burns a log index for it; when another server wins the next term,
// the old leader keeps the restored state (its stale reads show it) and
// rejects every append at the burned hole, so it never catches up while
// the new leader still has its whole log (README: restore limits). The fix
// is to carry a restore through the log (every replica rebases at the same
// index) instead of raft.Restore.
func TestClusterRestoreLostToAnotherLeader(t *testing.T) {
	if os.Getenv("LEASEHOLD_KNOWN_GAPS") == "" {
		t.Skip("known gap: a restore lost to another leader leaves the old leader diverged (set LEASEHOLD_KNOWN_GAPS=1 to run)")
	}
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	a, _, err := l.Acquire(ctx, AcquireRequest{Key: "a/1", Holder: "w1", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, l)
	if _, err := l.Release(ctx, ReleaseRequest{LeaseID: a.LeaseID, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	// Cut the leader off the moment it has installed the restored state,
	// before it can send it on.
	l.rep.mu.RLock()
	before := l.rep.f
	l.rep.mu.RUnlock()
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
			l.rep.mu.RLock()
			swapped := l.rep.f != before
			l.rep.mu.RUnlock()
			if swapped {
				c.isolate(l.cfg.NodeID)
				return
			}
			runtime.Gosched()
		}
	}()
	_, rerr := l.RestoreSnapshot(ctx, bytes.NewReader(file))
	<-cut
	t.Logf("restore on the cut-off leader: %v", rerr)
	nl := c.leader(l.cfg.NodeID)
	b, _, err := nl.Acquire(ctx, AcquireRequest{Key: "b/1", Holder: "w2", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	c.heal()
	if rerr == nil {
		t.Fatal("the restore was reported done, yet the server that installed it was cut off before any other server had it")
	}
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := l.GetLease(ctx, a.LeaseID, true)
		gb, errb := l.GetLease(ctx, b.LeaseID, true)
		if err == nil && errb == nil && got.State == "released" && gb.State == "active" {
			return
		}
		last = fmt.Sprintf("a/1: %v %v; b/1: %v %v", stateOf(got), err, stateOf(gb), errb)
		if time.Now().After(deadline) {
			t.Fatalf("the old leader never converged to the cluster's state: %s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func stateOf(l *Lease) string {
	if l == nil {
		return "-"
	}
	return l.State
}
