package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// restoreSource is a node with n leases of holder h, and a snapshot file
// of it.
func restoreSource(t *testing.T, n int, h string) (*Node, []byte) {
	t.Helper()
	src := openNode(t, testConfig(t, ""))
	for i := range n {
		if _, _, err := src.Acquire(context.Background(), wire.AcquireRequest{Key: fmt.Sprint("src/", i), Holder: h, TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	file, _ := saveSnapshot(t, src)
	return src, file
}

// stepsOf records the restore steps of n.
func stepsOf(n *Node) func() []string {
	var mu sync.Mutex
	var steps []string
	n.bk.onRestoreStep = func(s string) {
		mu.Lock()
		steps = append(steps, s)
		mu.Unlock()
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), steps...)
	}
}

// TestRestoreRefusedOverCountLimits: a restore whose result would exceed
// --max-leases or --max-leases-per-holder is refused before anything is
// sent (RESOURCE_EXHAUSTED naming the limit) and changes nothing; within
// the limits it applies. (Before, a restore ignored the limits.)
func TestRestoreRefusedOverCountLimits(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	for _, tc := range []struct {
		name  string
		set   func(*Config)
		field string
	}{
		{"max leases", func(c *Config) { c.MaxLeases = 4 }, "leases"},
		{"max leases per holder", func(c *Config) { c.MaxLeasesPerHolder = 2 }, "leases_per_holder"},
		{"within", func(c *Config) { c.MaxLeases = 5; c.MaxLeasesPerHolder = 3 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "")
			tc.set(&cfg)
			dst := openNode(t, cfg)
			for i := range 2 {
				if _, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("dst/", i), Holder: "b", TTLMS: 60000}); err != nil {
					t.Fatal(err)
				}
			}
			before := allLeases(t, dst)
			steps := stepsOf(dst)
			_, err := dst.RestoreSnapshot(ctx, bytes.NewReader(file))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("a restore within the limits: %v", err)
				}
				if got := len(allLeases(t, dst)); got != 5 {
					t.Fatalf("%d leases after the restore, want 5", got)
				}
				return
			}
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != wire.CodeResourceExhausted || e.Field != tc.field || !strings.Contains(e.Message, "nothing changed") {
				t.Fatalf("restore over %s: %v", tc.field, err)
			}
			if s := steps(); len(s) != 0 {
				t.Fatalf("a refused restore went on to %v", s)
			}
			if after := allLeases(t, dst); !reflect.DeepEqual(before, after) {
				t.Fatalf("a refused restore changed the leases: %v -> %v", before, after)
			}
		})
	}
}

// TestRestoreFenceFloorNode: the old cluster's fence_high (LocalState,
// leasehold_fence_high) given as the fence floor puts every restored token,
// and every later one, above every token the old cluster issued after the
// save; without it, the new cluster reissues one of them.
func TestRestoreFenceFloorNode(t *testing.T) {
	ctx := context.Background()
	src, file := restoreSource(t, 2, "a")
	var after []uint64 // tokens the old cluster issued after the save
	for i := range 5 {
		l, _, err := src.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("late/", i), Holder: "a", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		after = append(after, l.FencingToken)
	}
	ls, err := src.LocalState(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ls.FenceHigh != src.fenceForTest() || ls.FenceHigh < after[len(after)-1] {
		t.Fatalf("fence_high %d; the state's counter is %d, the last token %d", ls.FenceHigh, src.fenceForTest(), after[len(after)-1])
	}
	if m := gathered(t, src)["leasehold_fence_high"]; m == nil || uint64(m.GetMetric()[0].GetGauge().GetValue()) != ls.FenceHigh {
		t.Fatalf("leasehold_fence_high: %v, want %d", m, ls.FenceHigh)
	}
	reissued := func(floor uint64) bool {
		dst := openNode(t, testConfig(t, ""))
		if _, err := dst.RestoreSnapshotWith(ctx, bytes.NewReader(file), wire.RestoreOptions{FenceFloor: floor}); err != nil {
			t.Fatal(err)
		}
		toks := map[uint64]bool{}
		for _, l := range allLeases(t, dst) {
			toks[l.Fence] = true
		}
		l, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: "new", Holder: "c", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		toks[l.FencingToken] = true
		for _, tok := range after {
			if toks[tok] {
				return true
			}
		}
		return false
	}
	if !reissued(0) {
		t.Fatal("without a floor no token was reissued: the case is not exercised")
	}
	if reissued(ls.FenceHigh) {
		t.Fatal("a token the old cluster issued after the save was issued again despite the fence floor")
	}
}

// TestRestoreAdmissionMemory: a restore whose memory estimate exceeds the
// server's limit is refused before its body is read (UNAVAILABLE, the
// reason), and changes nothing.
func TestRestoreAdmissionMemory(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	cfg := testConfig(t, "")
	cfg.MemoryLimit = 1 << 20 // below any running server's heap
	dst := openNode(t, cfg)
	steps := stepsOf(dst)
	_, err := dst.RestoreSnapshot(ctx, bytes.NewReader(file))
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeUnavailable || !strings.Contains(e.Message, "of memory") || !strings.Contains(e.Message, "nothing changed") {
		t.Fatalf("restore over the memory limit: %v", err)
	}
	if s := steps(); len(s) != 0 {
		t.Fatalf("a refused restore went on to %v", s)
	}
	if len(allLeases(t, dst)) != 0 {
		t.Fatal("a refused restore changed the state")
	}
	// No memory check: it applies.
	cfg = testConfig(t, "")
	cfg.MemoryLimit = -1
	if _, err := openNode(t, cfg).RestoreSnapshot(ctx, bytes.NewReader(file)); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreAdmissionDisk: a restore is refused unless the server has
// restoreDiskFactor times the body, the spool and --min-free-disk free;
// with that much, it applies.
func TestRestoreAdmissionDisk(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	info, _, err := ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	const threshold = 1 << 20
	need := (restoreDiskFactor+1)*info.Size + threshold
	var free atomic.Int64
	free.Store(need - 1)
	cfg := testConfig(t, t.TempDir())
	cfg.MinFreeDisk = threshold
	cfg.diskFree = func(string) (int64, error) { return free.Load(), nil }
	dst := openNode(t, cfg)
	steps := stepsOf(dst)
	_, err = dst.RestoreSnapshot(ctx, bytes.NewReader(file))
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeUnavailable || !strings.Contains(e.Message, "of disk free") {
		t.Fatalf("restore without the disk: %v", err)
	}
	if s := steps(); len(s) != 0 {
		t.Fatalf("a refused restore went on to %v", s)
	}
	free.Store(need)
	if _, err := dst.RestoreSnapshot(ctx, bytes.NewReader(file)); err != nil {
		t.Fatalf("restore with room: %v", err)
	}
}
