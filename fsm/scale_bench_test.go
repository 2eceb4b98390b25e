package fsm

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// fill applies n standalone acquires (batches of 1000) on distinct keys,
// all expiring at the same tick, and returns the next free log index. Lease
// ids are random, as the node makes them (a fixed seed: every run the
// same), so the ordered indexes see the inserts a server sees.
func fill(b *testing.B, f *FSM, n int, ttlTicks uint64) uint64 {
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	idx := f.Index() + 1
	f.Apply(idx, &Tick{Tick: f.Tick() + 1, PeriodMS: 100, RetainTicks: 36000})
	idx++
	for i := 0; i < n; i += 1000 {
		batch := &Batch{}
		for j := i; j < min(n, i+1000); j++ {
			batch.Commands = append(batch.Commands, &Acquire{
				LeaseID: fmt.Sprintf("ls_%016x", rng.Uint64()), Key: fmt.Sprintf("camera/%d", j), Holder: fmt.Sprintf("runner-%d", j%500),
				Limit: 1, TokenHash: HashOf(fmt.Sprint(j)), TTLMS: int64(ttlTicks) * 100, TTLTicks: ttlTicks, WallMS: 1,
			})
		}
		f.Apply(idx, batch)
		idx++
		f.DrainEvents(func(*Event) {})
	}
	return idx
}

// BenchmarkMillionLeases reports the heap, snapshot and restore cost of
// 1,000,000 active leases in the state machine (TARGETS.md: < 600 MiB RSS,
// snapshot < 5 s, restart < 10 s for the whole node).
func BenchmarkMillionLeases(b *testing.B) {
	const n = 1_000_000
	for range b.N {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		f := New()
		start := time.Now()
		fill(b, f, n, 100000)
		grant := time.Since(start)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		var buf bytes.Buffer
		start = time.Now()
		if _, err := f.Snapshot().WriteTo(&buf); err != nil {
			b.Fatal(err)
		}
		snap := time.Since(start)
		runtime.GC()
		var beforeRestore runtime.MemStats
		runtime.ReadMemStats(&beforeRestore)
		g := New()
		start = time.Now()
		if err := g.Restore(&buf); err != nil {
			b.Fatal(err)
		}
		restore := time.Since(start)
		runtime.GC()
		var afterRestore runtime.MemStats
		runtime.ReadMemStats(&afterRestore)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(grant.Seconds(), "apply-s")
		b.ReportMetric(snap.Seconds(), "snapshot-s")
		b.ReportMetric(float64(buf.Cap())/(1<<20), "snapshot-MiB")
		b.ReportMetric(restore.Seconds(), "restore-s")
		b.ReportMetric(float64(afterRestore.HeapAlloc-beforeRestore.HeapAlloc)/(1<<20), "restored-heap-MiB")
		runtime.KeepAlive(f)
		runtime.KeepAlive(g)
	}
}

// BenchmarkExpiryStorm ends 100,000 leases due at the same tick, standalone
// or bound to one session, with every tick unlimited (one entry ends them
// all, as before chunked expiry) or limited to the node's chunk (then
// Expire entries end the rest, a client write between each two). It
// reports storm-ms, from the start of the first entry that ends one to the
// end of the last (what the state machine adds to the last lease's
// lateness), stall-max-ms, the longest of those entries (what a write
// waits behind at worst), and cpu-ms, the process's CPU time (user and
// system, the collector's included) from the first tick to the end: unlike
// the others it hardly depends on what else the machine runs.
func BenchmarkExpiryStorm(b *testing.B) {
	for _, kind := range []string{"standalone", "session"} {
		for _, chunk := range []uint64{0, benchChunk} {
			b.Run(fmt.Sprintf("%s/chunk=%d", kind, chunk), func(b *testing.B) {
				for range b.N {
					expiryStorm(b, kind == "session", chunk)
				}
			})
		}
	}
}

// benchChunk is the node's expireChunk.
const benchChunk = 4096

func expiryStorm(b *testing.B, bound bool, chunk uint64) {
	const n = 100_000
	b.StopTimer()
	f := New()
	var idx uint64
	if bound {
		idx = fillSession(f, n, 5)
	} else {
		idx = fill(b, f, n, 5)
	}
	runtime.GC()
	b.StartTimer()
	cpu0 := cpuTime()
	var start time.Time
	var stall time.Duration
	apply := func(c Command) {
		t0 := time.Now()
		before := f.active
		f.Apply(idx, c)
		idx++
		f.DrainEvents(func(*Event) {})
		d := time.Since(t0)
		if f.active < before && start.IsZero() {
			start = t0
		}
		if !start.IsZero() {
			stall = max(stall, d)
		}
	}
	writes := 0
	for t := f.Tick() + 1; f.active > 0; t++ {
		apply(&Tick{Tick: t, RetainTicks: 36000, ExpireMax: chunk})
		for f.Backlog() > 0 {
			writes++
			id := fmt.Sprintf("w_%016x", writes)
			f.Apply(idx, &Batch{Commands: []Command{
				&Acquire{LeaseID: id, Key: "w/" + id, Holder: "w", Limit: 1, TokenHash: HashOf(id), TTLMS: 500, TTLTicks: 5, WallMS: 1},
				&Release{LeaseID: id, TokenHash: HashOf(id), WallMS: 1},
			}})
			idx++
			f.DrainEvents(func(*Event) {})
			apply(&Expire{Tick: t, Max: chunk})
		}
	}
	b.ReportMetric(time.Since(start).Seconds()*1000, "storm-ms")
	b.ReportMetric(stall.Seconds()*1000, "stall-max-ms")
	b.ReportMetric((cpuTime()-cpu0).Seconds()*1000, "cpu-ms")
}

// fillSession binds n leases to one session (batches of 1000) that expires
// with ttlTicks, and returns the next free log index.
func fillSession(f *FSM, n int, ttlTicks uint64) uint64 {
	idx := f.Index() + 1
	f.Apply(idx, &Tick{Tick: f.Tick() + 1, PeriodMS: 100, RetainTicks: 36000})
	idx++
	f.Apply(idx, &SessionCreate{SessionID: "ss_storm", Holder: "runner", TokenHash: HashOf("s"),
		TTLMS: int64(ttlTicks) * 100, TTLTicks: ttlTicks, WallMS: 1})
	idx++
	rng := rand.New(rand.NewPCG(2, uint64(n)))
	for i := 0; i < n; i += 1000 {
		batch := &Batch{}
		for j := i; j < min(n, i+1000); j++ {
			batch.Commands = append(batch.Commands, &Acquire{
				LeaseID: fmt.Sprintf("ls_%016x", rng.Uint64()), Key: fmt.Sprintf("camera/%d", j), Limit: 1,
				SessionID: "ss_storm", SessionTokenHash: HashOf("s"), TokenHash: HashOf(fmt.Sprint(j)), WallMS: 1,
			})
		}
		f.Apply(idx, batch)
		idx++
		f.DrainEvents(func(*Event) {})
	}
	return idx
}

// BenchmarkSemaphoreStorm reports how long expiring and then pruning the
// 10,000 leases of one key of limit 10,000 takes (ids not in grant order).
func BenchmarkSemaphoreStorm(b *testing.B) {
	const n = MaxLimit
	for range b.N {
		b.StopTimer()
		f := New()
		idx := uint64(1)
		f.Apply(idx, &Tick{Tick: 1, PeriodMS: 100})
		for i := 0; i < n; i += 1000 {
			batch := &Batch{}
			for j := i; j < i+1000; j++ {
				id := HashOf(fmt.Sprint(j))
				batch.Commands = append(batch.Commands, &Acquire{
					LeaseID: fmt.Sprintf("ls_%x", id[:8]), Key: "sem", Holder: fmt.Sprintf("runner-%d", j%50),
					Limit: n, TokenHash: id, TTLMS: 500, TTLTicks: 5, WallMS: 1,
				})
			}
			idx++
			f.Apply(idx, batch)
			f.DrainEvents(func(*Event) {})
		}
		b.StartTimer()
		start := time.Now()
		for t := f.Tick() + 1; f.leases.Len() > 0; t++ {
			idx++
			f.Apply(idx, &Tick{Tick: t, RetainTicks: 3})
			f.DrainEvents(func(*Event) {})
		}
		b.ReportMetric(time.Since(start).Seconds()*1000, "storm-ms")
	}
}

// BenchmarkSnapshotWrite encodes a snapshot of 200,000 active leases
// (fill) to io.Discard: the encoder's CPU and allocations per snapshot,
// without the fill (done once) and without any I/O. cpu-ms/op is the
// process's CPU time (every goroutine's, the collector's too), steadier
// than the wall time on a shared machine.
func BenchmarkSnapshotWrite(b *testing.B) {
	f := New()
	fill(b, f, 200_000, 100000)
	runtime.GC()
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		if _, err := f.Snapshot().WriteTo(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// BenchmarkPruneStorm prunes the records of 100,000 leases that all ended
// in one tick (expired in chunks, as the node's ticks and Expire entries
// end them), once RetainTicks have passed, with ticks that prune all that
// is due (prune=0) or at most the node's chunk. It reports, over the entries
// from the first tick after the storm to the one that prunes the last
// record: stall-max-ms and stall-cpu-max-ms, the longest of those entries
// in wall time and in the process's CPU time (what a write waits behind
// at worst: the CPU figure hardly depends on what else the machine runs),
// cpu-ms, the CPU time of all of them, and entries, how many pruned
// something.
func BenchmarkPruneStorm(b *testing.B) {
	for _, prune := range []uint64{0, benchChunk} {
		b.Run(fmt.Sprintf("prune=%d", prune), func(b *testing.B) {
			for range b.N {
				pruneStorm(b, prune)
			}
		})
	}
}

func pruneStorm(b *testing.B, pruneMax uint64) {
	const n, retain = 100_000, 10
	b.StopTimer()
	f := New()
	idx := fill(b, f, n, 5)
	for t := f.Tick() + 1; f.active > 0; t++ {
		f.Apply(idx, &Tick{Tick: t, RetainTicks: retain, ExpireMax: benchChunk})
		idx++
		for f.Backlog() > 0 {
			f.Apply(idx, &Expire{Tick: t, Max: benchChunk})
			idx++
		}
		f.DrainEvents(func(*Event) {})
	}
	runtime.GC()
	b.StartTimer()
	var stall, stallCPU, cpu time.Duration
	entries := 0
	for t := f.Tick() + 1; f.leases.Len() > 0; t++ {
		before := f.leases.Len()
		c0, t0 := cpuTime(), time.Now()
		f.Apply(idx, &Tick{Tick: t, RetainTicks: retain, ExpireMax: benchChunk, PruneMax: pruneMax})
		d, dc := time.Since(t0), cpuTime()-c0
		idx++
		stall, stallCPU, cpu = max(stall, d), max(stallCPU, dc), cpu+dc
		if f.leases.Len() < before {
			entries++
		}
	}
	b.ReportMetric(stall.Seconds()*1000, "stall-max-ms")
	b.ReportMetric(stallCPU.Seconds()*1000, "stall-cpu-max-ms")
	b.ReportMetric(cpu.Seconds()*1000, "cpu-ms")
	b.ReportMetric(float64(entries), "entries")
}
