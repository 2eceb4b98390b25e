package main

import (
	"errors"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// Memory limit policy of relaxGC: the soft limit is baseMemLimit, or, once
// the live heap is large, the live heap plus a quarter (liveHeadroom); in a
// memory cgroup, never above cgroupShareNum/cgroupShareDen of the cgroup's
// limit.
const (
	baseMemLimit = 512 << 20
	liveHeadroom = 4 // limit = live + live/liveHeadroom
	// cgroupShareNum/cgroupShareDen is the part of a cgroup's memory limit
	// the soft limit may reach (9/10): the rest is headroom for what the
	// runtime does not count (cgo, thread stacks of the OS) and the page
	// cache charged to the cgroup, so that the collector works hard before
	// the kernel's OOM killer acts.
	cgroupShareNum, cgroupShareDen = 9, 10
	// memLimitEvery is how often the live heap is checked.
	memLimitEvery = 500 * time.Millisecond
	// An idle server returns its heap's free memory to the system (see
	// idleReturn): after idleChecks checks in a row that each saw less
	// than idleAllocs allocated, when at least idleFreeMin and a
	// (1/idleFreeShare) of the live heap are free, at most once every
	// idleReturnEvery. idleAllocs lies between what an idle server
	// allocates a check (its ticks, a metrics scrape) and a loaded one.
	idleChecks      = 2
	idleAllocs      = 512 << 10
	idleFreeMin     = 32 << 20
	idleFreeShare   = 16
	idleReturnEvery = time.Minute
)

// relaxGC trades memory for CPU in the long-running commands (server,
// bench): unless GOGC is set in the environment, the heap may grow to five
// times the live data before a collection (GOGC=400). Unless GOMEMLIMIT is
// set, a soft memory limit then makes the collector run more often as the
// heap approaches it: 512 MiB, or the live heap plus a quarter (plus what
// the runtime holds that a collection cannot free) when that is more, and
// never more than 90% of the memory limit of the process's cgroup, which
// relaxGC returns (0: none, or GOMEMLIMIT is set). The limit follows the
// live heap because a fixed one below a large state makes the collector
// run back to back; in a container the cap wins, so the collector works
// harder near it rather than the kernel killing the process. An idle
// server returns its free heap to the system (idleReturn).
func relaxGC() (cgroupLimit int64) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		cgroupLimit, _ = containerMemLimit() // unreadable: as if none
		first := memLimitFor(0, 0, cgroupLimit)
		debug.SetMemoryLimit(first)
		go followLiveHeap(first, cgroupLimit)
	}
	return cgroupLimit
}

// unlimitedCgroupMem: a cgroup limit at or above this means no limit (v1
// reports "unlimited" as the largest page-aligned int64).
const unlimitedCgroupMem = 1 << 62

// containerMemLimit is the memory limit of this process's cgroup, read by
// automemlimit (cgroup v2 memory.max, the smallest of the cgroup and its
// ancestors; v1 the hierarchical limit; a hybrid system's v1 memory
// controller first): 0 when there is none.
func containerMemLimit() (int64, error) {
	n, err := memlimit.FromCgroup()
	switch {
	case errors.Is(err, memlimit.ErrNoLimit), errors.Is(err, memlimit.ErrNoCgroup), errors.Is(err, memlimit.ErrCgroupsNotSupported):
		return 0, nil
	case err != nil:
		return 0, err
	case n == 0 || n >= unlimitedCgroupMem:
		return 0, nil
	}
	return int64(n), nil
}

// restoreMemLimit is the hard memory bound a restore's admission check
// holds its estimate to (node.Config.MemoryLimit): GOMEMLIMIT when set,
// else cgroupLimit (relaxGC's; 0: none, and the node uses the machine's
// memory).
func restoreMemLimit(cgroupLimit int64) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		if l := debug.SetMemoryLimit(-1); l > 0 && l < math.MaxInt64 {
			return l
		}
		return 0
	}
	return cgroupLimit
}

// followLiveHeap keeps the memory limit at memLimitFor(the live heap),
// checked after every collection (a finalizer that re-arms itself) and
// every memLimitEvery, so that it keeps up with a restore's fast-growing
// heap. last is the limit in force, cgroupLimit the cgroup's (0: none).
func followLiveHeap(last, cgroupLimit int64) {
	var mu sync.Mutex
	sample := memSamples()
	update := func() bool {
		mu.Lock()
		defer mu.Unlock()
		live, overhead, ok := readMem(sample)
		if !ok {
			return false // not supported by this runtime
		}
		if limit := memLimitFor(live, overhead, cgroupLimit); limit != last {
			debug.SetMemoryLimit(limit)
			last = limit
		}
		return true
	}
	if !update() {
		return
	}
	afterEachGC(func() { update() })
	idle, idleSample := idleReturn{}, memSamples() // update's sample is under mu
	for now := range time.Tick(memLimitEvery) {
		update()
		metrics.Read(idleSample)
		if idle.due(now, idleSample[5].Value.Uint64(), idleSample[3].Value.Uint64(), idleSample[0].Value.Uint64()) {
			debug.FreeOSMemory()
		}
	}
}

// idleReturn decides when an idle server returns its heap's free memory to
// the system (debug.FreeOSMemory: a collection, then every free page
// released), which the runtime's scavenger otherwise keeps. A server that
// allocates keeps it (the headroom of the next collections), so the forced
// collection runs only once nothing has been allocated for idleChecks
// checks, and at most once every idleReturnEvery.
type idleReturn struct {
	allocs uint64    // bytes allocated in total at the last check
	quiet  int       // checks in a row that saw less than idleAllocs allocated
	last   time.Time // the last return
}

// due is called every memLimitEvery with the total bytes allocated so far,
// the heap's free (not yet released) bytes and the live heap, and says
// whether to return the free memory now.
func (r *idleReturn) due(now time.Time, allocs, free, live uint64) bool {
	quiet := allocs-r.allocs < idleAllocs
	r.allocs = allocs
	if !quiet {
		r.quiet = 0
		return false
	}
	r.quiet++
	if r.quiet < idleChecks || free < max(idleFreeMin, live/idleFreeShare) || (!r.last.IsZero() && now.Sub(r.last) < idleReturnEvery) {
		return false
	}
	r.last, r.quiet = now, 0
	return true
}

// gcSentinel is an object only a finalizer refers to: it is collected, and
// its finalizer run, by every garbage collection.
type gcSentinel struct {
	fn  func()
	pad [16]byte // not a tiny allocation, whose finalizer might never run
}

// afterEachGC calls fn (in the finalizer goroutine) after every collection.
func afterEachGC(fn func()) {
	runtime.SetFinalizer(&gcSentinel{fn: fn}, func(s *gcSentinel) {
		s.fn()
		afterEachGC(s.fn)
	})
}

// memSamples are the runtime metrics readMem reads.
func memSamples() []metrics.Sample {
	return []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/heap/allocs:bytes"},
	}
}

// readMem returns the live heap and the memory the runtime holds that a
// collection cannot free (goroutine stacks, metadata, unused parts of
// spans in use), which the memory limit counts too.
func readMem(s []metrics.Sample) (live, overhead uint64, ok bool) {
	metrics.Read(s)
	for _, m := range s {
		if m.Value.Kind() != metrics.KindUint64 {
			return 0, 0, false
		}
	}
	total, objects, free, released := s[1].Value.Uint64(), s[2].Value.Uint64(), s[3].Value.Uint64(), s[4].Value.Uint64()
	if held := objects + free + released; total > held {
		overhead = total - held
	}
	return s[0].Value.Uint64(), overhead, true
}

// memLimitFor is the memory limit for a live heap of live bytes and
// overhead bytes the collector cannot free, rounded up to 16 MiB so that
// small changes do not move it, and at most cgroupShareNum/cgroupShareDen
// of cgroupLimit when that is set (> 0).
func memLimitFor(live, overhead uint64, cgroupLimit int64) int64 {
	want := live + live/liveHeadroom + overhead
	want = (want + 16<<20 - 1) &^ (16<<20 - 1)
	limit := max(int64(baseMemLimit), int64(want))
	if cgroupLimit > 0 {
		limit = min(limit, cgroupLimit/cgroupShareDen*cgroupShareNum)
	}
	return limit
}
