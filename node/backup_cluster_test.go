package node

import (
	"bytes"
	"context"
	"fmt"
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
