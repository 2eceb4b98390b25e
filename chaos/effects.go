package chaos

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Effects: what a scenario's fault must visibly have done, measured while
// it lasts, so that a fault that never landed (a rule not installed, a
// delay not applied) fails the run as ineffective.

// appliedWatch samples every node's applied index every 250 ms while a
// fault lasts.
type appliedWatch struct {
	e      *Env
	stop   context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	last   []uint64
	since  []time.Time // when the node's index last moved
	stall  []time.Duration
	lagSum []float64 // sum over samples of the node's distance behind the highest index
	lagN   int
	maxIdx uint64
	maxAt  time.Time // when the highest index last moved
	allFor time.Duration
}

// watchApplied starts sampling; Stop ends it.
func (e *Env) watchApplied(ctx context.Context) *appliedWatch {
	n := e.C.Size()
	now := time.Now()
	w := &appliedWatch{e: e, done: make(chan struct{}), last: make([]uint64, n), since: make([]time.Time, n),
		stall: make([]time.Duration, n), lagSum: make([]float64, n), maxAt: now}
	for i := range w.since {
		w.since[i] = now
	}
	ctx, w.stop = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			w.sample(ctx)
			_ = sleepCtx(ctx, 250*time.Millisecond)
		}
	}()
	return w
}

func (w *appliedWatch) sample(ctx context.Context) {
	n := len(w.last)
	idx := make([]uint64, n)
	ok := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ls, err := w.e.Local(ctx, i, 0, time.Second); err == nil {
				idx[i], ok[i] = ls.AppliedIndex, true
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	top := w.maxIdx
	for i := range n {
		if ok[i] && idx[i] > top {
			top = idx[i]
		}
	}
	if top > w.maxIdx {
		w.maxIdx, w.maxAt = top, now
	}
	w.allFor = max(w.allFor, now.Sub(w.maxAt))
	all := true
	for i := range n {
		if !ok[i] {
			all = false
			continue
		}
		if idx[i] != w.last[i] {
			w.last[i], w.since[i] = idx[i], now
		}
		w.stall[i] = max(w.stall[i], now.Sub(w.since[i]))
	}
	if all {
		for i := range n {
			w.lagSum[i] += float64(top - idx[i])
		}
		w.lagN++
	}
}

// Stop ends the sampling with a last sample, taken now (while the fault
// still lasts): a node that stood still is measured to the end.
func (w *appliedWatch) Stop() {
	w.stop()
	<-w.done
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w.sample(ctx)
}

// stalled is how many nodes' applied index stood still for at least d
// while the fault lasted, and the longest such stretch.
func (w *appliedWatch) stalled(d time.Duration) (int, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, longest := 0, time.Duration(0)
	for _, s := range w.stall {
		if s >= d {
			n++
		}
		longest = max(longest, s)
	}
	return n, longest
}

// nothingApplied is the longest stretch in which no node's applied index
// moved.
func (w *appliedWatch) nothingApplied() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allFor
}

// meanLag is node i's mean distance behind the highest applied index.
func (w *appliedWatch) meanLag(i int) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lagN == 0 {
		return math.NaN()
	}
	return w.lagSum[i] / float64(w.lagN)
}

// cutFault is Fault (or FaultNoQuorum) for a partition: while it lasts the
// nodes' applied indexes are watched, and a node that cannot hear the
// leader stands still. The effect: "node-stalled" counts the rounds in
// which some node's applied index stood still for 2 s or more. A cut that
// never landed leaves every node applying the leader's ticks.
func (e *Env) cutFault(ctx context.Context, noQuorum bool, name, detail string, d time.Duration, apply, undo func() error) error {
	var w *appliedWatch
	fault := e.Fault
	if noQuorum {
		fault = e.FaultNoQuorum
	}
	return fault(ctx, name, detail, d, func() error {
		if err := apply(); err != nil {
			return err
		}
		w = e.watchApplied(ctx)
		return nil
	}, func() error {
		if w != nil {
			w.Stop()
			n, longest := w.stalled(2 * time.Second)
			if n > 0 {
				e.Count("node-stalled", 1)
			}
			e.Note(name, fmt.Sprintf("%s: %d node(s) applied nothing for 2 s or more (longest %v)", detail, n, longest.Round(100*time.Millisecond)), nil)
		}
		return undo()
	})
}

// writeLatency is the shortest round trip of three writes through node l
// (grants, each a commit; up to six tries, as a busy machine can time one
// out).
func (e *Env) writeLatency(ctx context.Context, l int) (time.Duration, error) {
	best := time.Duration(math.MaxInt64)
	var last error
	for k, ok := 0, 0; k < 6 && ok < 3; k++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		lease, err := e.Admin(l).Acquire(actx, wire.AcquireRequest{Key: fmt.Sprintf("chaos-latency/%d/%d", e.H.Now(), k), Holder: "latency-probe", TTLMS: 1000})
		if err == nil {
			ok++
			best = min(best, time.Since(t0))
			_, _ = e.Admin(l).Release(actx, wire.ReleaseRequest{LeaseID: lease.LeaseID, Token: lease.Token})
		} else {
			last = err
			_ = sleepCtx(ctx, 300*time.Millisecond) // an election, a busy machine: try again
		}
		cancel()
	}
	if best == time.Duration(math.MaxInt64) {
		return 0, fmt.Errorf("no probe write through node %d succeeded: %v", l, last)
	}
	return best, nil
}

// tickRate is the cluster clock's pace between the harness times from and
// to (history time, ns), from the tick reads answered in between: ticks
// advanced times the period, over the real time between the first read's
// answer and the last read's call (so a clock at real pace reads about 1 or
// above). NaN with fewer than two reads or no time between them.
func (h *History) tickRate(from, to int64) float64 {
	var first, last *Op
	ops := h.Ops()
	for k := range ops {
		o := &ops[k]
		if o.Kind != KTick || o.Status != StatusOK || o.PeriodMS <= 0 || o.Call < from || o.Return > to {
			continue
		}
		if first == nil || o.Return < first.Return {
			first = o
		}
		if last == nil || o.Call > last.Call {
			last = o
		}
	}
	if first == nil || last == nil || last.Call <= first.Return {
		return math.NaN()
	}
	return float64(last.Value-first.Value) * float64(first.PeriodMS) * 1e6 / float64(last.Call-first.Return)
}
