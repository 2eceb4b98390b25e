package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// watchSchedule watches a server whose stream opens once, then ends, and
// then refuses every reconnection with a 5xx, and returns the first n
// reconnection delays Watch chose.
func watchSchedule(t *testing.T, n int) []time.Duration {
	t.Helper()
	var conns atomic.Int64
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if conns.Add(1) == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			return // the stream ends: a reconnection after an open stream
		}
		writeErr(w, http.StatusInternalServerError, wire.CodeInternal, "failing over (test)")
	})
	c := newClient(t, s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var delays []time.Duration
	_ = c.Watch(ctx, WatchOptions{OnReconnect: func(_ error, d time.Duration) {
		if delays = append(delays, d); len(delays) == n {
			cancel()
		}
	}}, func(wire.Event) error { return nil })
	if len(delays) != n {
		t.Errorf("%d reconnections before the deadline, want %d", len(delays), n)
	}
	return delays
}

// TestWatchReconnectsWithFullJitter: two clients whose streams broke at the
// same instant (a failover) do not reconnect in lockstep: each delay is
// drawn from [0, min(5 s, 100 ms·2^attempt)], so their schedules differ.
func TestWatchReconnectsWithFullJitter(t *testing.T) {
	const n = 4
	var wg sync.WaitGroup
	var a, b []time.Duration
	wg.Add(2)
	go func() { defer wg.Done(); a = watchSchedule(t, n) }()
	go func() { defer wg.Done(); b = watchSchedule(t, n) }()
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, s := range [][]time.Duration{a, b} {
		for i, d := range s {
			if ceil := watchMinBackoff << i; d < 0 || d > ceil {
				t.Errorf("reconnection %d waited %v, outside [0, %v]", i, d, ceil)
			}
		}
	}
	if fmt.Sprint(a) == fmt.Sprint(b) {
		t.Errorf("two clients reconnect on the same schedule %v: in lockstep", a)
	}
}

// TestBackoffFullJitter: delay n is drawn from [0, min(Max, Base·2^n)], from
// the injected source, and Reset starts over.
func TestBackoffFullJitter(t *testing.T) {
	var asked []time.Duration
	top := func(n int64) int64 { asked = append(asked, time.Duration(n)); return n - 1 }
	b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second, Rand: top}
	var got []time.Duration
	for range 8 {
		got = append(got, b.Next())
	}
	want := "[100ms 200ms 400ms 800ms 1.6s 3.2s 5s 5s]"
	if fmt.Sprint(got) != want {
		t.Errorf("delays at the top of the window %v, want %s", got, want)
	}
	for i, n := range asked {
		if n != got[i]+1 {
			t.Errorf("draw %d asked for [0, %v), want [0, %v]: the window must include its ceiling", i, n, got[i])
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Errorf("after Reset: %v, want 100ms", d)
	}
	b.Rand = func(int64) int64 { return 0 }
	if d := b.Next(); d != 0 {
		t.Errorf("bottom of the window: %v, want 0", d)
	}
	// Many retries later the ceiling stays at Max (no overflow).
	b.Rand = top
	for i := range 200 {
		if d := b.Next(); i > 10 && d != 5*time.Second {
			t.Fatalf("late delay %v, want the cap", d)
		}
	}

	// Two clients with their own sources: both within the windows, on
	// different schedules.
	sched := func(seed uint64) []time.Duration {
		r := rand.New(rand.NewPCG(seed, seed))
		b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second, Rand: r.Int64N}
		var out []time.Duration
		for i := range 10 {
			ceil := b.Ceiling()
			d := b.Next()
			if d < 0 || d > ceil || ceil != min(100*time.Millisecond<<i, 5*time.Second) {
				t.Errorf("seed %d: delay %d is %v, ceiling %v", seed, i, d, ceil)
			}
			out = append(out, d)
		}
		return out
	}
	if a, b := sched(1), sched(2); fmt.Sprint(a) == fmt.Sprint(b) {
		t.Errorf("two sources gave the same schedule %v", a)
	}
}

// failingRenewer fails every renewal with a retryable error.
type failingRenewer struct{ n atomic.Int64 }

func (f *failingRenewer) Renew(context.Context, time.Duration) (*wire.Lease, error) {
	f.n.Add(1)
	return nil, &wire.Error{Code: wire.CodeNoLeader, Message: "no leader (test)"}
}

func (f *failingRenewer) Release(context.Context, string) error { return nil }

// TestKeepAliveRetryBackoff: failed renewals are retried after a jittered
// backoff, drawn from [0, 50 ms·2^n] and capped at the keep-alive's retry
// period, not after the same fixed period by every holder.
func TestKeepAliveRetryBackoff(t *testing.T) {
	var mu sync.Mutex
	var asked []time.Duration
	backoffRand = func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, time.Duration(n-1))
		return n - 1 // the top of the window
	}
	const ttl = 3 * time.Second
	f := &failingRenewer{}
	ka, err := KeepAliveWith(context.Background(), f, &wire.Lease{LeaseID: "ls_1", TTLMS: ttl.Milliseconds()}, time.Now(),
		KeepAliveOptions{Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backoffRand = nil }) // runs after ka.Stop: nothing reads it then
	t.Cleanup(ka.Stop)
	waitFor(t, 30*time.Second, "six renewal retries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(asked) >= 6
	})
	ka.Stop()
	mu.Lock()
	defer mu.Unlock()
	// Interval 1 s: retry period 1 s/4.
	want := "[50ms 100ms 200ms 250ms 250ms 250ms]"
	if got := fmt.Sprint(asked[:6]); got != want {
		t.Errorf("retry ceilings %s, want %s", got, want)
	}
}
