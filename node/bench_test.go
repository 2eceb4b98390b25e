package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures acquire+release cycles on distinct keys
// through the embedded API of a disk-backed single node (fsync on).
func BenchmarkAcquireRelease(b *testing.B) {
	n := benchNode(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := seq.Add(1)
		i := 0
		for pb.Next() {
			i++
			l, _, err := n.Acquire(ctx, AcquireRequest{Key: fmt.Sprintf("b/%d/%d", id, i), Holder: "bench", TTLMS: 10000})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := n.Release(ctx, ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRenew measures single-lease renewals from many goroutines.
func BenchmarkRenew(b *testing.B) {
	n := benchNode(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := seq.Add(1)
		l, _, err := n.Acquire(ctx, AcquireRequest{Key: fmt.Sprintf("r/%d", id), Holder: "bench", TTLMS: 60000})
		if err != nil {
			b.Fatal(err)
		}
		for pb.Next() {
			if _, err := n.Renew(ctx, l.LeaseID, l.Token, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchNode opens a disk-backed single node with the default tick period.
func benchNode(b *testing.B) *Node {
	cfg := testConfig(b, b.TempDir())
	cfg.TickPeriod = DefaultConfig().TickPeriod
	n, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	<-n.Ready()
	waitFor(b, 5*time.Second, n.isLeaderReady)
	return n
}
