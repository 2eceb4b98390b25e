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
		live, overhead uint64
		want           int64
	}{
		{0, 0, baseMemLimit},
		{100 * mib, 0, baseMemLimit},
		{409 * mib, 0, baseMemLimit}, // 511.25 MiB rounds up to 512
		{480 * mib, 0, 608 * mib},
		{600 * mib, 0, 752 * mib},
		{600 * mib, 200 * mib, 960 * mib}, // the overhead is on top
		{300 * mib, 100 * mib, baseMemLimit},
	} {
		got := memLimitFor(tt.live, tt.overhead, 0)
		if got != tt.want {
			t.Errorf("memLimitFor(%d MiB, %d MiB) = %d MiB, want %d MiB", tt.live/mib, tt.overhead/mib, got/mib, tt.want/mib)
		}
		if got < int64(tt.live+tt.live/liveHeadroom+tt.overhead) {
			t.Errorf("memLimitFor(%d MiB, %d MiB) = %d MiB is below the live heap plus its headroom and the overhead", tt.live/mib, tt.overhead/mib, got/mib)
		}
	}
}

// TestMemLimitCgroupCeiling: in a memory cgroup the limit never passes
// 90% of the cgroup's limit, however large the live heap; below that it is
// the policy without a cgroup.
func TestMemLimitCgroupCeiling(t *testing.T) {
	const mib = 1 << 20
	for _, tt := range []struct {
		live, overhead uint64
		cgroup, want   int64
	}{
		{0, 0, 512 * mib, 512 * mib / 10 * 9},         // a 512 MiB container: 90%, not the 512 MiB base
		{0, 0, 256 * mib, 256 * mib / 10 * 9},         // below the base
		{600 * mib, 0, 512 * mib, 512 * mib / 10 * 9}, // a live heap past the cap: the cap
		{0, 0, 4096 * mib, baseMemLimit},              // a large cgroup: the base
		{600 * mib, 0, 4096 * mib, 752 * mib},         // and the live heap's limit
		{3000 * mib, 500 * mib, 4096 * mib, 4096 * mib / 10 * 9},
		{600 * mib, 0, 0, 752 * mib}, // no cgroup limit
	} {
		got := memLimitFor(tt.live, tt.overhead, tt.cgroup)
		if got != tt.want {
			t.Errorf("memLimitFor(%d MiB, %d MiB, cgroup %d MiB) = %.1f MiB, want %.1f MiB",
				tt.live/mib, tt.overhead/mib, tt.cgroup/mib, float64(got)/mib, float64(tt.want)/mib)
		}
		if tt.cgroup > 0 && got > tt.cgroup*9/10 {
			t.Errorf("memLimitFor(%d MiB, %d MiB, cgroup %d MiB) = %d MiB: above 90%% of the cgroup's limit",
				tt.live/mib, tt.overhead/mib, tt.cgroup/mib, got/mib)
		}
	}
}

// TestReadMemCountsStacks: the overhead readMem reports includes goroutine
// stacks: 2,000 goroutines with deep stacks raise it by at least 16 MiB.
func TestReadMemCountsStacks(t *testing.T) {
	s := memSamples()
	_, before, ok := readMem(s)
	if !ok {
		t.Fatal("runtime metrics not supported")
	}
	const n = 2000
	release := make(chan struct{})
	started := make(chan struct{}, n)
	var deep func(int)
	deep = func(d int) {
		var pad [1024]byte
		if d > 0 {
			deep(d - 1)
			pad[0]++
			return
		}
		started <- struct{}{}
		<-release
		_ = pad
	}
	for range n {
		go deep(16) // >= 16 KiB of stack each
	}
	for range n {
		<-started
	}
	_, during, _ := readMem(s)
	close(release)
	if during < before+16<<20 {
		t.Fatalf("overhead %d MiB with %d deep stacks, %d MiB before: stacks are not counted", during>>20, n, before>>20)
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

// TestIdleReturn: free memory is returned once nothing was allocated for
// idleChecks checks in a row and enough is free, then not again within
// idleReturnEvery; allocation resets the count.
func TestIdleReturn(t *testing.T) {
	const mib = 1 << 20
	var r idleReturn
	now := time.Unix(1000, 0)
	allocs := uint64(0)
	step := func(alloc, free, live uint64) bool {
		now = now.Add(memLimitEvery)
		allocs += alloc
		return r.due(now, allocs, free, live)
	}
	if step(100*mib, 200*mib, 400*mib) {
		t.Fatal("returned while allocating")
	}
	// A lightly loaded server (2 MiB a second: a few hundred requests)
	// is not idle.
	for range 4 * idleChecks {
		if step(mib, 200*mib, 400*mib) {
			t.Fatal("returned under light load")
		}
	}
	for i := 1; i < idleChecks; i++ {
		if step(0, 200*mib, 400*mib) {
			t.Fatalf("returned after %d quiet checks, want %d", i, idleChecks)
		}
	}
	if !step(0, 200*mib, 400*mib) {
		t.Fatalf("not returned after %d quiet checks with 200 MiB free", idleChecks)
	}
	for range idleChecks + 2 {
		if step(0, 200*mib, 400*mib) {
			t.Fatal("returned again within idleReturnEvery")
		}
	}
	now = now.Add(idleReturnEvery)
	if step(idleAllocs, 200*mib, 400*mib) {
		t.Fatal("returned while allocating")
	}
	for range idleChecks + 2 {
		if step(0, 20*mib, 400*mib) {
			t.Fatal("returned with less free than live/idleFreeShare")
		}
	}
	if !step(0, 40*mib, 400*mib) {
		t.Fatal("not returned with 40 MiB free of a 400 MiB live heap")
	}
}
