package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
	dto "github.com/prometheus/client_model/go"
)

// gathered returns the node registry's families by name.
func gathered(t *testing.T, n *Node) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := n.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// TestCountersNotCountedOnReplay: a restarted server replays its log, and
// the events of the replayed entries are not counted again; entries
// applied after the restart are.
func TestCountersNotCountedOnReplay(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	n := openNode(t, cfg)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: k, Holder: "h", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.Stats().Acquired; got != 3 {
		t.Fatalf("acquired before restart = %d, want 3", got)
	}
	applied := n.AppliedIndex()
	n.Close()

	n2 := openNode(t, cfg)
	waitFor(t, 30*time.Second, func() bool { return n2.AppliedIndex() >= applied })
	st := n2.Stats()
	if st.ActiveLeases != 3 {
		t.Fatalf("active leases after restart = %d, want 3 (the log was not replayed?)", st.ActiveLeases)
	}
	if st.Acquired != 0 {
		t.Fatalf("acquired after restart = %d, want 0: the replay counted the log's events again", st.Acquired)
	}
	if _, _, err := n2.Acquire(ctx, wire.AcquireRequest{Key: "d", Holder: "h", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	if got := n2.Stats().Acquired; got != 1 {
		t.Fatalf("acquired after a new acquire = %d, want 1", got)
	}
}

// TestRegistryCollectors: the node's registry has the standard
// collectors, build info, raft's own metrics and the node's, and two nodes
// in one process have registries of their own.
func TestRegistryCollectors(t *testing.T) {
	n := openNode(t, testConfig(t, t.TempDir()))
	other := openNode(t, testConfig(t, ""))
	if n.Registry() == other.Registry() {
		t.Fatal("two nodes share a registry")
	}
	ctx := context.Background()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 100})
	if err != nil {
		t.Fatal(err)
	}
	var fams map[string]*dto.MetricFamily
	waitFor(t, 30*time.Second, func() bool {
		fams = gathered(t, n)
		f := fams["leasehold_expiry_lateness_seconds"]
		if f == nil {
			return false
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == "lease" && m.GetHistogram().GetSampleCount() > 0 {
					return fams["leasehold_tick_interval_seconds"].GetMetric()[0].GetHistogram().GetSampleCount() > 0
				}
			}
		}
		return false
	})
	_ = l
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "leasehold_build_info",
		"leasehold_leader_changes_total", "leasehold_tick_period_seconds", "leasehold_term",
		"leasehold_snapshots_total", "leasehold_acquire_wait_seconds"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	bi := fams["leasehold_build_info"].GetMetric()[0]
	labels := map[string]string{}
	for _, lp := range bi.GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	if labels["version"] == "" || labels["goversion"] == "" || labels["commit"] == "" {
		t.Errorf("build info labels %v", labels)
	}
	if fams["leasehold_leader_changes_total"].GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Error("the first leader is not counted as a leader change")
	}
	raft := 0
	for name := range fams {
		if strings.HasPrefix(name, "leasehold_raft_") && name != "leasehold_term" {
			raft++
		}
	}
	if fams["leasehold_raft_commitTime"] == nil || fams["leasehold_raft_fsm_applyBatch"] == nil {
		t.Errorf("raft's own metrics are missing (%d leasehold_raft_* families)", raft)
	}
	// A lease expiring is late by at most a few periods here: its nominal
	// end is last renewal + TTL, and expiry waits GraceTicks ticks.
}

// histogramCount is the sample count of the histogram with the given
// label value in family name.
func histogramCount(t *testing.T, n *Node, name, labelValue string) uint64 {
	t.Helper()
	f := gathered(t, n)[name]
	if f == nil {
		t.Fatalf("no %s", name)
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetValue() == labelValue {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	t.Fatalf("%s has no series labelled %q", name, labelValue)
	return 0
}

// TestAcquireWaitObserved: a queued acquire's wait is observed once, as
// granted when the holder releases, as refused when wait_ms runs out; an
// acquire that never queued is not observed.
func TestAcquireWaitObserved(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	first, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "a", TTLMS: 60000, WaitMS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "b", TTLMS: 60000, WaitMS: 60000})
		done <- err
	}()
	waitFor(t, 30*time.Second, func() bool {
		n.waits.mu.Lock()
		defer n.waits.mu.Unlock()
		return len(n.waits.m) == 1
	})
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: first.LeaseID, Token: first.Token}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("queued acquire: %v", err)
	}
	if got := histogramCount(t, n, "leasehold_acquire_wait_seconds", "granted"); got != 1 {
		t.Fatalf("granted waits observed = %d, want 1", got)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "c", TTLMS: 60000, WaitMS: 100}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire of a held key with a short wait: %v, want LEASE_HELD", err)
	}
	if got := histogramCount(t, n, "leasehold_acquire_wait_seconds", "refused"); got != 1 {
		t.Fatalf("refused waits observed = %d, want 1", got)
	}
	if got := histogramCount(t, n, "leasehold_acquire_wait_seconds", "granted"); got != 1 {
		t.Fatalf("granted waits observed = %d after a refusal, want 1", got)
	}
}

// TestSnapshotObserved: a Raft snapshot is counted, timed and sized.
func TestSnapshotObserved(t *testing.T) {
	n := openNode(t, testConfig(t, t.TempDir()))
	if _, _, err := n.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	if err := n.cl.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	fams := gathered(t, n)
	var ok, failed float64
	for _, m := range fams["leasehold_snapshots_total"].GetMetric() {
		switch m.GetLabel()[0].GetValue() {
		case "ok":
			ok = m.GetCounter().GetValue()
		case "failed":
			failed = m.GetCounter().GetValue()
		}
	}
	if ok != 1 || failed != 0 {
		t.Fatalf("snapshots ok %v failed %v, want 1 and 0", ok, failed)
	}
	if size := fams["leasehold_snapshot_size_bytes"].GetMetric()[0].GetGauge().GetValue(); size <= 0 {
		t.Fatalf("snapshot size %v", size)
	}
	if c := fams["leasehold_snapshot_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); c != 1 {
		t.Fatalf("snapshot durations observed %d, want 1", c)
	}
}
