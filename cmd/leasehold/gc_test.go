package main

import (
	"runtime"
	"testing"
	"time"
)

// TestMemLimitFollowsLiveHeap: the limit is the base until the live heap
// plus a quarter passes it, then follows it (rounded up to 16 MiB), so a
// large state never sits above its limit with the collector running back
// to back.
func TestMemLimitFollowsLiveHeap(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		live uint64
		want int64
	}{
		{0, baseMemLimit},
		{100 * mib, baseMemLimit},
		{409 * mib, baseMemLimit}, // 511.25 MiB rounds up to 512
		{480 * mib, 608 * mib},
		{600 * mib, 752 * mib},
	} {
		got := memLimitFor(tt.live)
		if got != tt.want {
			t.Errorf("memLimitFor(%d MiB) = %d MiB, want %d MiB", tt.live/mib, got/mib, tt.want/mib)
		}
		if got < int64(tt.live+tt.live/liveHeadroom) {
			t.Errorf("memLimitFor(%d MiB) = %d MiB is below the live heap plus its headroom", tt.live/mib, got/mib)
		}
	}
}

// TestAfterEachGC: the hook runs after every collection, not once.
func TestAfterEachGC(t *testing.T) {
	calls := make(chan struct{}, 100)
	afterEachGC(func() {
		select {
		case calls <- struct{}{}:
		default:
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < 3; {
		runtime.GC()
		select {
		case <-calls:
			n++
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("the hook ran %d times in 30 s of collections", n)
			}
		}
	}
}
