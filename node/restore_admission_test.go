package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
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
// save; without it, the new cluster issues tokens not above them (the
// restored ones follow the file's counter, which the old cluster's later
// tokens passed).
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
	// lowest is the lowest token of the new cluster after a restore with
	// floor: the restored ones and one acquired after. (Tokens follow the
	// log index, so whether one of them equals one of after depends on
	// where the old cluster's ticks fell: compare with the highest.)
	lowest := func(floor uint64) uint64 {
		dst := openNode(t, testConfig(t, ""))
		if _, err := dst.RestoreSnapshotWith(ctx, bytes.NewReader(file), wire.RestoreOptions{FenceFloor: floor}); err != nil {
			t.Fatal(err)
		}
		low := uint64(math.MaxUint64)
		for _, l := range allLeases(t, dst) {
			low = min(low, l.Fence)
		}
		l, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: "new", Holder: "c", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		return min(low, l.FencingToken)
	}
	high := slices.Max(after)
	if low := lowest(0); low > high {
		t.Fatalf("without a floor every token (from %d) is above the old cluster's later ones (up to %d): the case is not exercised", low, high)
	}
	if low := lowest(ls.FenceHigh); low <= high {
		t.Fatalf("despite the fence floor %d the new cluster issued token %d, not above %d, the old cluster's last after the save", ls.FenceHigh, low, high)
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

// TestRestoreAdmissionPeerMemory: the leader holds the estimate to every
// voter's memory limit, which gossip carries: a follower with too little
// is named in the refusal, and nothing changes anywhere.
func TestRestoreAdmissionPeerMemory(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	c := newTestCluster(t)
	n1 := c.start(clusterConfig("n1"))
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		if id == "n3" {
			cfg.MemoryLimit = 1 << 20
		}
		c.start(cfg)
	}
	c.voters(3)
	l := c.leader()
	if l == c.node("n3") {
		t.Skip("n3 leads: its own limit is TestRestoreAdmissionMemory's case")
	}
	var err error
	start := time.Now()
	waitFor(t, 15*time.Second, func() bool {
		_, err = l.RestoreSnapshot(ctx, bytes.NewReader(file))
		return err == nil || strings.Contains(err.Error(), "server n3 may use")
	})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeUnavailable {
		t.Fatalf("restore with a follower short of memory: %v", err)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)
	if got := len(allLeases(t, l)); got != 0 {
		t.Fatalf("%d leases after a refused restore", got)
	}
}

// TestSkipRestore: a server configured to skip a restore (Config.SkipRestore,
// --skip-restore) applies its commit as a refusal that changes nothing;
// another restore applies as usual.
func TestSkipRestore(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	info, body, err := ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "")
	cfg.SkipRestore = "rs_stuck"
	n := openNode(t, cfg)
	commit := func(id string) fsm.Result {
		chunks, err := n.bk.sendRestoreChunks(ctx, id, bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		res, _, err := n.bk.applyRestoreEntry(&fsm.RestoreCommit{ID: id, Chunks: chunks, Size: uint64(info.Size), SHA256: sha256.Sum256(raw)})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := commit("rs_stuck"); res.Err == nil || res.Restore != nil || !strings.Contains(res.Err.Message, "--skip-restore") {
		t.Fatalf("the skipped restore: %+v", res)
	}
	if got := len(allLeases(t, n)); got != 0 {
		t.Fatalf("%d leases after a skipped restore", got)
	}
	if res := commit("rs_other"); res.Err != nil || res.Restore == nil {
		t.Fatalf("another restore: %+v", res)
	}
	if got := len(allLeases(t, n)); got != 3 {
		t.Fatalf("%d leases after a restore, want 3", got)
	}
}

// TestRestoreOverLimitsRefusedAtCommit: above restorePreviewMax records the
// leader skips its dry run, and the commit's apply refuses a result over
// the limits (RESOURCE_EXHAUSTED), changing nothing.
func TestRestoreOverLimitsRefusedAtCommit(t *testing.T) {
	ctx := context.Background()
	_, file := restoreSource(t, 3, "a")
	old := restorePreviewMax
	restorePreviewMax = 0
	t.Cleanup(func() { restorePreviewMax = old })
	cfg := testConfig(t, "")
	cfg.MaxLeases = 4
	dst := openNode(t, cfg)
	for i := range 2 {
		if _, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("dst/", i), Holder: "b", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	before := allLeases(t, dst)
	steps := stepsOf(dst)
	_, err := dst.RestoreSnapshot(ctx, bytes.NewReader(file))
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeResourceExhausted || e.Field != "leases" || !strings.Contains(e.Message, "nothing changed") {
		t.Fatalf("restore over --max-leases: %v", err)
	}
	if s := steps(); !reflect.DeepEqual(s, []string{"first-chunk", "chunks-sent", "committed"}) {
		t.Fatalf("steps %v: the commit did not decide", s)
	}
	if after := allLeases(t, dst); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused restore changed the leases: %v -> %v", before, after)
	}
}
