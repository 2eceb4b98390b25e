package node

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestHostileLoad (make hostile; LEASEHOLD_HOSTILE=1) drives one in-memory
// node with hostile load from clients holding valid tokens: waiters on one
// key giving up at staggered times, acquire/release churn leaving ended
// records, concurrent full listings with a prefix that matches nothing, and
// event-stream subscribers. Meanwhile it measures how much of real time the
// cluster clock keeps and the latency of a probe writer. It reports figures
// and fails if the clock keeps less than LEASEHOLD_HOSTILE_MIN_CLOCK (0.9)
// of real time or the probe's p99 is LEASEHOLD_HOSTILE_MAX_P99_MS (20) or
// more. It is a load test, not a unit test: its figures depend on the
// machine, so it never runs with the ordinary tests. `make hostile-ci` (CI)
// runs it at a scale a shared machine carries with bounds only a
// regression of the kind the bounds fixed (0.53 of real time, 789 ms) can
// fail; the full-scale targets are not met on such a machine
// (docs/operations.md#hostile-load).
//
// Scale (environment): LEASEHOLD_HOSTILE_WAITERS (10000),
// LEASEHOLD_HOSTILE_CHURN (1000000 ended records), LEASEHOLD_HOSTILE_LISTERS
// (100), LEASEHOLD_HOSTILE_SUBS (1000).
func TestHostileLoad(t *testing.T) {
	if os.Getenv("LEASEHOLD_HOSTILE") == "" {
		t.Skip("set LEASEHOLD_HOSTILE=1 (make hostile)")
	}
	env := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
			return v
		}
		return def
	}
	waiters := env("LEASEHOLD_HOSTILE_WAITERS", 10000)
	churn := env("LEASEHOLD_HOSTILE_CHURN", 1_000_000)
	listers := env("LEASEHOLD_HOSTILE_LISTERS", 100)
	subs := env("LEASEHOLD_HOSTILE_SUBS", 1000)
	minClock := 0.9
	if v, err := strconv.ParseFloat(os.Getenv("LEASEHOLD_HOSTILE_MIN_CLOCK"), 64); err == nil && v > 0 {
		minClock = v
	}
	maxP99 := time.Duration(env("LEASEHOLD_HOSTILE_MAX_P99_MS", 20)) * time.Millisecond
	t.Logf("scale: %d waiters on one key, %d ended records of churn, %d listers, %d subscribers", waiters, churn, listers, subs)

	cfg := testConfig(t, "")
	cfg.TickPeriod = DefaultConfig().TickPeriod // the production clock
	cfg.MaxLeases = -1
	cfg.MaxLeasesPerHolder = -1
	cfg.MaxEventStreams = subs + 16
	hostileConfig(&cfg, waiters)
	n := openNode(t, cfg)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// The probe: a lease renewed every 10 ms.
	probe, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "probe", Holder: "probe", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "hot", Holder: "owner", TTLMS: 600000}); err != nil {
		t.Fatal(err)
	}
	tick0, wall0 := n.fsmTick(), time.Now()
	var wg sync.WaitGroup
	var probeLat []time.Duration
	var probeErrs atomic.Int64
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for ctx.Err() == nil {
			start := time.Now()
			if _, err := n.Renew(ctx, probe.LeaseID, probe.Token, 0); err != nil && ctx.Err() == nil {
				probeErrs.Add(1)
			}
			probeLat = append(probeLat, time.Since(start))
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	// Subscribers, draining their streams.
	for i := range subs {
		s, err := n.Subscribe(ctx, wire.EventFilter{})
		if err != nil {
			t.Fatalf("subscriber %d: %v", i, err)
		}
		go func() {
			for range s.Events() {
			}
		}()
	}

	// Waiters on one key, giving up at staggered times over 1-6 s.
	var waitRefused, waitTimedOut atomic.Int64
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "hot", Holder: fmt.Sprint("w", i%500), TTLMS: 60000,
				WaitMS: int64(1000 + (i*5000)/max(waiters, 1))})
			if err != nil {
				if exhaustedErr(err) {
					waitRefused.Add(1)
				} else {
					waitTimedOut.Add(1)
				}
			}
		}()
	}

	// Churn: acquire and release, leaving ended records.
	var churned atomic.Int64
	const churners = 16
	for c := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < churn && ctx.Err() == nil; i += churners {
				l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("churn/", i), Holder: fmt.Sprint("c", c), TTLMS: 60000})
				if err != nil {
					continue
				}
				if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err == nil {
					churned.Add(1)
				}
			}
		}()
	}

	// Listers: full listings of a prefix that matches nothing, again and
	// again, until the churn and the waiters are done.
	var listings, pages atomic.Int64
	listCtx, stopLists := context.WithCancel(ctx)
	var lw sync.WaitGroup
	for range listers {
		lw.Add(1)
		go func() {
			defer lw.Done()
			for listCtx.Err() == nil {
				after := ""
				for listCtx.Err() == nil {
					page, err := n.ListLeases(listCtx, wire.ListRequest{Prefix: "nothing/", After: after, Limit: 1000}, true)
					if err != nil {
						break
					}
					pages.Add(1)
					if page.Next == "" {
						listings.Add(1)
						break
					}
					after = page.Next
				}
			}
		}()
	}

	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(30 * time.Minute):
		t.Error("load did not finish within 30 minutes")
	}
	tick1, wall1 := n.fsmTick(), time.Now()
	stopLists()
	lw.Wait()
	stop()
	<-probeDone

	elapsed := wall1.Sub(wall0)
	ratio := float64(tick1-tick0) * float64(cfg.TickPeriod) / float64(elapsed)
	slices.Sort(probeLat)
	p := func(q float64) time.Duration {
		if len(probeLat) == 0 {
			return 0
		}
		return probeLat[min(len(probeLat)-1, int(q*float64(len(probeLat))))]
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	n.rep.mu.RLock()
	retained, _ := n.rep.f.Leases(fsmFilterAll())
	n.rep.mu.RUnlock()
	t.Logf("ran %v: clock kept %.3f of real time (%d ticks of %v)", elapsed.Round(time.Millisecond), ratio, tick1-tick0, cfg.TickPeriod)
	t.Logf("probe writer: %d renewals, %d errors, p50 %v, p99 %v, max %v", len(probeLat), probeErrs.Load(), p(0.5), p(0.99), p(1))
	t.Logf("waiters: %d timed out, %d refused; churn: %d released; listings: %d full (%d pages); lease records kept: %d; heap in use %d MiB",
		waitTimedOut.Load(), waitRefused.Load(), churned.Load(), listings.Load(), pages.Load(), len(retained), ms.HeapInuse>>20)
	if ratio < minClock {
		t.Errorf("the cluster clock kept %.3f of real time, want >= %v", ratio, minClock)
	}
	if p(0.99) >= maxP99 {
		t.Errorf("probe writer p99 %v, want < %v", p(0.99), maxP99)
	}
}

func (n *Node) fsmTick() uint64 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Tick()
}

func exhaustedErr(err error) bool {
	e, ok := err.(*wire.Error)
	return ok && e.Code == wire.CodeResourceExhausted
}
