package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// loadUntil acquires leases on distinct keys through s, one after the
// other, until stop is closed, the first failure after stop, or max
// leases; it returns those the server acknowledged (201).
func loadUntil(s *server, prefix string, ttl time.Duration, max int, stop <-chan struct{}) []*wire.Lease {
	var acked []*wire.Lease
	for i := 0; i < max; i++ {
		select {
		case <-stop:
			return acked
		default:
		}
		var l wire.Lease
		code, _, _, err := call("POST", "http://"+s.http+"/v1/leases",
			map[string]any{"key": fmt.Sprintf("%s/%d", prefix, i), "holder": "w", "ttl_ms": ttl.Milliseconds()}, nil, &l)
		if err == nil && code == http.StatusCreated {
			acked = append(acked, &l)
			continue
		}
		// No quorum any more: wait for stop rather than spin.
		select {
		case <-stop:
			return acked
		case <-time.After(50 * time.Millisecond):
		}
	}
	return acked
}

// TestClusterLostQuorumRecover: a three-server cluster under load loses two
// servers for good (killed, data directories wiped). The third, stopped,
// is exported (data export-snapshot, checked by snapshot inspect) and
// recovered (data recover): started alone on its data directory it leads,
// holds every lease it acknowledged, and fences above all of them; a
// fresh server then joins it the ordinary way. Both log stores.
func TestClusterLostQuorumRecover(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"boltdb", "wal"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel() // a cluster of its own
			testLostQuorumRecover(t, store)
		})
	}
}

func testLostQuorumRecover(t *testing.T, store string) {
	c := newCluster(t, "--raft-log", store)
	leader := c.waitFormed(c.nodes)
	lost := c.others(leader)
	const ttl = 10 * time.Minute

	stop := make(chan struct{})
	var acked []*wire.Lease
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); acked = loadUntil(leader, "q", ttl, 2000, stop) }()
	// Under load: the two others go for good once some leases are in.
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		st, err := leader.status()
		if err != nil {
			return false, err.Error()
		}
		return st.AppliedIndex > 60, fmt.Sprintf("applied %d", st.AppliedIndex)
	})
	sigkillAll(lost...)
	for _, s := range lost {
		if err := os.RemoveAll(s.dataDir); err != nil {
			t.Fatal(err)
		}
	}
	// Writes stop once the leader misses its quorum: it steps down.
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		st, err := leader.status()
		if err != nil {
			return false, err.Error()
		}
		return st.State != "Leader", "still " + st.State
	})
	close(stop)
	wg.Wait()
	if len(acked) < 10 {
		t.Fatalf("only %d leases acknowledged under load", len(acked))
	}
	var maxFence uint64
	for _, l := range acked {
		maxFence = max(maxFence, l.FencingToken)
	}

	out := filepath.Join(t.TempDir(), "export.snap")
	if r := runBinary(t, "data", "export-snapshot", "--data-dir", leader.dataDir, out); r.status != 1 || !strings.Contains(r.stderr, "locked") {
		t.Fatalf("export-snapshot of a running server's data dir: exit %d\n%s%s", r.status, r.stdout, r.stderr)
	}
	if err := leader.stop(); err != nil {
		t.Fatal(err)
	}

	// The stopped survivor's state, as a restorable backup.
	if r := runBinary(t, "data", "export-snapshot", "--data-dir", leader.dataDir, out); r.status != 0 {
		t.Fatalf("export-snapshot: exit %d\n%s%s", r.status, r.stdout, r.stderr)
	}
	r := runBinary(t, "snapshot", "inspect", "--json", out)
	var info wire.SnapshotInfo
	if r.status != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil || info.State == nil {
		t.Fatalf("snapshot inspect of the export: exit %d\n%s%s", r.status, r.stdout, r.stderr)
	}
	if info.State.FencingToken < maxFence || info.State.ActiveLeases < len(acked) || info.NodeID != leader.nodeID {
		t.Fatalf("export: %+v (state %+v), want fencing token >= %d, >= %d leases, saved by %s",
			info, *info.State, maxFence, len(acked), leader.nodeID)
	}

	// Recover: the survivor's configuration becomes itself alone (its id
	// found from its data directory).
	r = runBinary(t, "data", "recover", "--data-dir", leader.dataDir)
	if r.status != 0 || !strings.Contains(r.stdout, "configuration is now "+leader.nodeID) {
		t.Fatalf("data recover: exit %d\n%s%s", r.status, r.stdout, r.stderr)
	}
	t.Logf("data recover:\n%s", r.stdout)
	if r := runBinary(t, "data", "recover", "--data-dir", t.TempDir()); r.status != 1 || !strings.Contains(r.stderr, "not a data dir") {
		t.Fatalf("data recover of an empty directory: exit %d\n%s", r.status, r.stderr)
	}

	// Started again with the command it ran with before (its --join
	// still names the lost servers).
	restart := time.Now()
	leader.launch()
	leader.waitReady()
	t.Logf("the recovered server is ready %v after its start", time.Since(restart).Round(time.Millisecond))
	st, err := leader.status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Leader != leader.nodeID || len(st.Members) < 1 {
		t.Fatalf("after the recovery: %+v", st)
	}
	for _, m := range st.Members {
		if m.Voter && m.ID != leader.nodeID {
			t.Fatalf("after the recovery %s is still a voter: %+v", m.ID, st.Members)
		}
	}
	for _, l := range acked {
		got, _, err := getLease(leader, l.LeaseID, false)
		if err != nil || got.State != "active" || got.FencingToken != l.FencingToken || got.Key != l.Key {
			t.Fatalf("acknowledged lease %s (fence %d) after the recovery: %+v %v", l.LeaseID, l.FencingToken, got, err)
		}
	}
	next := acquire(t, leader, "q/after", "w", ttl)
	if next.FencingToken <= maxFence || next.FencingToken <= info.State.FencingToken {
		t.Fatalf("fence %d after the recovery, not above %d (export: %d)", next.FencingToken, maxFence, info.State.FencingToken)
	}

	// A fresh server (an empty data directory) joins the ordinary way and
	// becomes a voter with the whole state.
	fresh := lost[0]
	fresh.extra = []string{"--join", leader.gossip, "--raft-log", store}
	fresh.launch()
	eventuallyMsg(t, 2*clusterTimeout, func() (bool, string) {
		st, err := leader.status()
		if err != nil {
			return false, err.Error()
		}
		for _, m := range st.Members {
			if m.ID == fresh.nodeID && m.Voter && m.Health == "healthy" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("members %+v", st.Members)
	})
	fresh.waitReady()
	waitLeaseEverywhere(t, []*server{leader, fresh}, next, "active")
	for _, l := range acked[len(acked)-3:] {
		waitLeaseEverywhere(t, []*server{fresh}, l, "active")
	}
}
