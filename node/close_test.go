package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Close while many writes are in flight: nothing panics and every caller
// returns promptly.
func TestCloseUnderLoad(t *testing.T) {
	for round := range 10 {
		n, err := Open(testConfig(t, ""))
		if err != nil {
			t.Fatal(err)
		}
		<-n.Ready()
		waitFor(t, 5*time.Second, n.lt.isReady)
		var ok atomic.Int64
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100000; i++ {
					// Short TTLs so that expiries (and their events) race the close.
					if _, _, err := n.Acquire(context.Background(), wire.AcquireRequest{Key: fmt.Sprintf("k%d-%d", w, i), Holder: "h", TTLMS: 50}); err != nil {
						return
					}
					ok.Add(1)
				}
			}()
		}
		waitFor(t, 10*time.Second, func() bool { return ok.Load() > 50 })
		n.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: callers still blocked 30s after Close", round)
		}
	}
}

// A retry of a queued acquire with the same idempotency key keeps the place
// in the queue even when the first attempt gives up.
func TestIdempotentRetryOfQueuedAcquire(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	bg := context.Background()
	a, _, err := n.Acquire(bg, wire.AcquireRequest{Key: "k", Holder: "a", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	// listeners is the most requests listening for one queued lease.
	listeners := func() int {
		n.waits.mu.Lock()
		defer n.waits.mu.Unlock()
		most := 0
		for _, l := range n.waits.m {
			most = max(most, len(l))
		}
		return most
	}
	req := wire.AcquireRequest{Key: "k", Holder: "b", TTLMS: 60000, WaitMS: 4000, IdempotencyKey: "idem-1"}
	ctx1, cancel1 := context.WithCancel(bg)
	first := make(chan error, 1)
	go func() { _, _, err := n.Acquire(ctx1, req); first <- err }()
	waitFor(t, 5*time.Second, func() bool { return listeners() == 1 })
	type res struct {
		l   *wire.Lease
		err error
	}
	second := make(chan res, 1)
	go func() { l, _, err := n.Acquire(bg, req); second <- res{l, err} }()
	waitFor(t, 5*time.Second, func() bool { return listeners() == 2 })
	cancel1()
	if err := <-first; err == nil {
		t.Fatal("cancelled attempt succeeded")
	}
	if _, err := n.Release(bg, wire.ReleaseRequest{LeaseID: a.LeaseID, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil || r.l.Holder != "b" || r.l.Token == "" {
		t.Fatalf("retry with the same idempotency key: %+v %v", r.l, r.err)
	}
}

// ?from=start replays what is kept even after the ring has wrapped.
func TestFromStartAfterWrap(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.EventHistory = 4
	n := openNode(t, cfg)
	for i := range 6 {
		if _, _, err := n.Acquire(context.Background(), wire.AcquireRequest{Key: fmt.Sprint("k", i), Holder: "h", TTLMS: 5000}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := n.Subscribe(context.Background(), wire.EventFilter{FromStart: true})
	if err != nil {
		t.Fatalf("from start once the ring wrapped: %v", err)
	}
	defer sub.Close()
	ev := <-sub.Events()
	if ev.Index == 0 {
		t.Fatalf("no event replayed: %+v", ev)
	}
	// Resuming from before the kept history is refused.
	if _, err := n.Subscribe(context.Background(), wire.EventFilter{After: "1-0"}); wire.ErrorCode(err) != wire.CodeEventsCompacted {
		t.Fatalf("resume before history: %v", err)
	}
}
