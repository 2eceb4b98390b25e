package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Below the threshold the leader refuses acquires and new sessions before
// proposing them; renewals, heartbeats, releases and revokes go on; above
// it again, acquires resume.
func TestDiskGuardRefusesGrowth(t *testing.T) {
	var free atomic.Int64
	free.Store(200 << 20)
	cfg := testConfig(t, t.TempDir())
	cfg.MinFreeDisk = 100 << 20
	cfg.diskFree = func(string) (int64, error) { return free.Load(), nil }
	n := openNode(t, cfg)
	ctx := context.Background()

	var held []*wire.Lease
	for _, k := range []string{"a", "b", "c", "d"} {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: k, Holder: "h", TTLMS: 10000})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	sess, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "h", TTLMS: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if n.DiskLow() {
		t.Fatal("low with 200 MiB free")
	}

	free.Store(50 << 20)
	var refusal error
	try := 0
	waitFor(t, 10*time.Second, func() bool {
		try++
		_, _, refusal = n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("x", try), Holder: "h", TTLMS: 10000})
		return refusal != nil
	})
	var e *wire.Error
	if !errors.As(refusal, &e) || e.Code != wire.CodeResourceExhausted || e.Field != "min_free_disk" || e.Limit != 100<<20 ||
		!strings.Contains(e.Message, "50 MiB free") || !strings.Contains(e.Message, "--min-free-disk (100 MiB)") {
		t.Fatalf("refusal: %#v", refusal)
	}
	if !n.DiskLow() {
		t.Fatal("DiskLow false while refusing")
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "h", TTLMS: 10000}); wire.ErrorCode(err) != wire.CodeResourceExhausted {
		t.Fatalf("session create while low: %v", err)
	}
	if _, err := n.Renew(ctx, held[0].LeaseID, held[0].Token, 0); err != nil {
		t.Fatalf("renew while low: %v", err)
	}
	if res, err := n.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: held[1].LeaseID, Token: held[1].Token}}); err != nil || !res[0].OK {
		t.Fatalf("heartbeat while low: %v %+v", err, res)
	}
	if _, err := n.SessionHeartbeat(ctx, sess.SessionID, sess.Token); err != nil {
		t.Fatalf("session heartbeat while low: %v", err)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: held[2].LeaseID, Token: held[2].Token}); err != nil {
		t.Fatalf("release while low: %v", err)
	}
	if _, err := n.Revoke(ctx, held[3].LeaseID, "ops"); err != nil {
		t.Fatalf("revoke while low: %v", err)
	}
	if err := n.HealthErr(); err != nil {
		t.Fatalf("HealthErr while low: %v", err)
	}

	free.Store(200 << 20)
	waitFor(t, 10*time.Second, func() bool {
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "y", Holder: "h", TTLMS: 10000})
		return err == nil
	})
}

// The default threshold covers one more log segment and a snapshot:
// max(256 MiB, twice the latest snapshot).
func TestMinFreeDiskDefault(t *testing.T) {
	dir := t.TempDir()
	n := &Node{cfg: Config{DataDir: dir}}
	n.disk.cfg = &n.cfg
	if got := n.disk.minFreeDisk(); got != DefaultMinFreeDisk {
		t.Fatalf("no snapshot: %d", got)
	}
	snap := filepath.Join(dir, "snapshots", "2-100-1700000000000")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(snap, "state.bin"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(200 << 20) // sparse
	f.Close()
	if got := n.disk.minFreeDisk(); got != 400<<20 {
		t.Fatalf("with a 200 MiB snapshot: %d, want 400 MiB", got)
	}
	n.cfg.MinFreeDisk = 5 << 20
	if got := n.disk.minFreeDisk(); got != 5<<20 {
		t.Fatalf("configured: %d", got)
	}
	n.cfg.MinFreeDisk = -1
	if got := n.disk.minFreeDisk(); got != 0 {
		t.Fatalf("off: %d", got)
	}
}
