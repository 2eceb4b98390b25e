package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestLimitWaitersPerKey: the node carries its waiter limits into the log:
// with MaxWaitersPerKey 2, two acquires queue on a held key and a third is
// RESOURCE_EXHAUSTED waiters_per_key at once (it does not wait).
func TestLimitWaitersPerKey(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxWaitersPerKey = 2
	cfg.MaxWaitersPerHolder = 100
	n := openNode(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "a", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: fmt.Sprint("w", i), TTLMS: 60000, WaitMS: 60000})
			done <- err
		}()
	}
	waitFor(t, 10*time.Second, func() bool { return queued(n) == 2 })
	_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "x", TTLMS: 60000, WaitMS: 60000})
	if !exhausted(err, "waiters_per_key", 2) {
		t.Fatalf("third waiter: %v, want RESOURCE_EXHAUSTED waiters_per_key 2", err)
	}
	cancel()
	for range 2 {
		<-done
	}
}

// TestLimitWaitersPerHolder: one holder queues on two keys, the third is
// refused with waiters_per_holder.
func TestLimitWaitersPerHolder(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxWaitersPerHolder = 2
	n := openNode(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for i := range 3 {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("k", i), Holder: "a", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		go func() {
			_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("k", i), Holder: "w", TTLMS: 60000, WaitMS: 60000})
			done <- err
		}()
	}
	waitFor(t, 10*time.Second, func() bool { return queued(n) == 2 })
	_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k2", Holder: "w", TTLMS: 60000, WaitMS: 60000})
	if !exhausted(err, "waiters_per_holder", 2) {
		t.Fatalf("third waiter: %v, want RESOURCE_EXHAUSTED waiters_per_holder 2", err)
	}
	cancel()
	for range 2 {
		<-done
	}
}

// TestMaxRetained: ended leases beyond MaxRetained are pruned by the next
// ticks, long before Retention.
func TestMaxRetained(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxRetained = 5
	n := openNode(t, cfg)
	ctx := context.Background()
	for i := range 20 {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("k", i), Holder: "a", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, func() bool {
		list, err := n.ListLeases(ctx, wire.ListRequest{Limit: 1000}, false)
		return err == nil && len(list.Leases) <= 5
	})
}

func queued(n *Node) int {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Waiting()
}

// TestListBounded: a listing looks at a bounded number of records per
// request: with a prefix that matches nothing, the page is empty with a
// cursor; following cursors reaches the end; matches are all found.
func TestListBounded(t *testing.T) {
	oldChunk, oldScan := listChunk, listScan
	listChunk, listScan = 4, 12
	t.Cleanup(func() { listChunk, listScan = oldChunk, oldScan })
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	for i := range 40 {
		key := fmt.Sprint("a/", i)
		if i%10 == 0 {
			key = fmt.Sprint("b/", i)
		}
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: key, Holder: "h", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: fmt.Sprint("h", i%10), TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	// No key has the prefix: the key index answers at once.
	page, err := n.ListLeases(ctx, wire.ListRequest{Prefix: "zz/"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Leases) != 0 || page.Next != "" {
		t.Fatalf("prefix of no key: %d leases, next %q; want none and no cursor", len(page.Leases), page.Next)
	}
	// Keys match, records do not: a bounded walk, then a cursor.
	page, err = n.ListLeases(ctx, wire.ListRequest{Prefix: "a/", State: "revoked"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Leases) != 0 || page.Next == "" {
		t.Fatalf("filter matching nothing: %d leases, next %q; want none and a cursor", len(page.Leases), page.Next)
	}
	found, pages := 0, 0
	for after := ""; ; pages++ {
		page, err := n.ListLeases(ctx, wire.ListRequest{Prefix: "b/", After: after}, false)
		if err != nil {
			t.Fatal(err)
		}
		found += len(page.Leases)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if found != 4 || pages != 3 {
		t.Fatalf("%d leases in %d pages, want 4 in 3 (12 records a page)", found, pages)
	}
	found = 0
	for after := ""; ; {
		page, err := n.ListSessions(ctx, "h3", after, 100, false)
		if err != nil {
			t.Fatal(err)
		}
		found += len(page.Sessions)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if found != 4 {
		t.Fatalf("%d sessions of h3, want 4", found)
	}
}

// TestListScanSlots: listing chunks run in a bounded number of slots: with
// every slot taken, a listing waits for one (and gives up with its
// context); once a slot is free, it completes.
func TestListScanSlots(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	for range cap(n.rep.scans) {
		n.rep.scans <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := n.ListLeases(ctx, wire.ListRequest{Prefix: "x/"}, true)
		done <- err
	}()
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("listing with every slot taken: %v, want context.Canceled", err)
	}
	go func() {
		_, err := n.ListLeases(context.Background(), wire.ListRequest{Prefix: "x/"}, true)
		done <- err
	}()
	<-n.rep.scans
	if err := <-done; err != nil {
		t.Fatalf("listing once a slot is free: %v", err)
	}
}
