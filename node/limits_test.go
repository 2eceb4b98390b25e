package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// exhausted reports whether err is RESOURCE_EXHAUSTED naming field with
// value limit.
func exhausted(err error, field string, limit uint64) bool {
	var e *wire.Error
	return errors.As(err, &e) && e.Code == wire.CodeResourceExhausted && e.Field == field && e.Limit == limit
}

// TestLimitMaxLeasesConcurrent: concurrent acquires cannot overshoot the
// cluster's lease limit (it is decided in apply, one entry after another):
// exactly the limit succeed, every other is RESOURCE_EXHAUSTED, and a
// release makes room again.
func TestLimitMaxLeasesConcurrent(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxLeases = 10
	n := openNode(t, cfg)
	ctx := context.Background()

	const tries = 40
	var (
		mu     sync.Mutex
		leases []*wire.Lease
		wg     sync.WaitGroup
		errs   = make(chan error, tries)
	)
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("k/", i), Holder: fmt.Sprint("h", i), TTLMS: 60000})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			leases = append(leases, l)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if len(leases) != 10 {
		t.Fatalf("%d acquires succeeded under a limit of 10", len(leases))
	}
	for err := range errs {
		if !exhausted(err, "leases", 10) {
			t.Fatalf("refusal %v, want RESOURCE_EXHAUSTED leases 10", err)
		}
	}
	if s := n.Stats(); s.ActiveLeases != 10 {
		t.Fatalf("%d active leases, want 10", s.ActiveLeases)
	}
	// A queued acquire counts too, so waiting is refused at the limit.
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k/0", Holder: "w", TTLMS: 60000, WaitMS: 100}); !exhausted(err, "leases", 10) {
		t.Fatalf("queued acquire at the limit: %v", err)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: leases[0].LeaseID, Token: leases[0].Token}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "after", Holder: "x", TTLMS: 60000}); err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "over", Holder: "x", TTLMS: 60000}); !exhausted(err, "leases", 10) {
		t.Fatalf("acquire over the limit again: %v", err)
	}
}

// TestLimitPerHolderAndSessions: leases per holder (expiry frees room),
// sessions per holder and in the cluster.
func TestLimitPerHolderAndSessions(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxLeasesPerHolder = 2
	cfg.MaxSessions = 3
	cfg.MaxSessionsPerHolder = 2
	n := openNode(t, cfg)
	ctx := context.Background()

	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "a", Holder: "alice", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	// Short enough to wait for its expiry, long enough that a loaded
	// machine does not let it expire before the refusals below.
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "b", Holder: "alice", TTLMS: 1500}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "c", Holder: "alice", TTLMS: 60000}); !exhausted(err, "leases_per_holder", 2) {
		t.Fatalf("third lease of alice: %v", err)
	}
	if l, err := n.ListLeases(ctx, wire.ListRequest{Key: "c"}, false); err != nil || len(l.Leases) != 0 {
		t.Fatalf("a refused acquire left %v (%v)", l, err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "c", Holder: "bob", TTLMS: 60000}); err != nil {
		t.Fatalf("another holder: %v", err)
	}
	// Lease b expires (1.5 s): alice has room again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "d", Holder: "alice", TTLMS: 60000})
		if err == nil {
			break
		}
		if !exhausted(err, "leases_per_holder", 2) || time.Now().After(deadline) {
			t.Fatalf("acquire after expiry: %v", err)
		}
		<-time.After(20 * time.Millisecond)
	}

	s1, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "alice", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "alice", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "alice", TTLMS: 60000}); !exhausted(err, "sessions_per_holder", 2) {
		t.Fatalf("third session of alice: %v", err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "bob", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "carol", TTLMS: 60000}); !exhausted(err, "sessions", 3) {
		t.Fatalf("fourth session: %v", err)
	}
	if s := n.Stats(); s.ActiveSessions != 3 {
		t.Fatalf("%d active sessions, want 3", s.ActiveSessions)
	}
	if _, err := n.EndSession(ctx, s1.SessionID, s1.Token, false); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "carol", TTLMS: 60000}); err != nil {
		t.Fatalf("session after an end: %v", err)
	}
}

// TestLimitEventStreams: at most MaxEventStreams subscriptions; closing one
// makes room.
func TestLimitEventStreams(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.MaxEventStreams = 2
	n := openNode(t, cfg)
	ctx := context.Background()
	a, err := n.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := n.Subscribe(ctx, wire.EventFilter{}); !exhausted(err, "event_streams", 2) {
		t.Fatalf("third stream: %v", err)
	}
	if got := n.Stats().EventStreams; got != 2 {
		t.Fatalf("%d streams counted after a refusal, want 2", got)
	}
	a.Close()
	waitFor(t, 5*time.Second, func() bool { return n.Stats().EventStreams == 1 })
	c, err := n.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatalf("stream after a close: %v", err)
	}
	c.Close()
}

// TestLimitSizes: keys up to 512 bytes, holders up to 128, metadata up to
// 16 entries and 4 KiB; one byte or entry more is INVALID_ARGUMENT naming
// the field, and creates nothing.
func TestLimitSizes(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	meta := func(entries, bytes int) map[string]string {
		m := map[string]string{}
		for i := range entries {
			m[fmt.Sprintf("k%02d", i)] = ""
		}
		m["k00"] = strings.Repeat("v", bytes-3*entries)
		return m
	}
	for _, tt := range []struct {
		name  string
		req   wire.AcquireRequest
		field string // "": accepted
	}{
		{"key at 512", wire.AcquireRequest{Key: strings.Repeat("k", 512), Holder: "h"}, ""},
		{"key at 513", wire.AcquireRequest{Key: strings.Repeat("k", 513), Holder: "h"}, "key"},
		{"empty key", wire.AcquireRequest{Key: "", Holder: "h"}, "key"},
		{"holder at 128", wire.AcquireRequest{Key: "a", Holder: strings.Repeat("h", 128)}, ""},
		{"holder at 129", wire.AcquireRequest{Key: "b", Holder: strings.Repeat("h", 129)}, "holder"},
		{"metadata 16 entries, 4 KiB", wire.AcquireRequest{Key: "c", Holder: "h", Metadata: meta(16, 4096)}, ""},
		{"metadata 17 entries", wire.AcquireRequest{Key: "d", Holder: "h", Metadata: meta(17, 4096)}, "metadata"},
		{"metadata 4 KiB + 1", wire.AcquireRequest{Key: "e", Holder: "h", Metadata: meta(16, 4097)}, "metadata"},
	} {
		before := n.Stats().ActiveLeases
		tt.req.TTLMS = 60000
		_, _, err := n.Acquire(ctx, tt.req)
		var e *wire.Error
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.field != "" && (!errors.As(err, &e) || e.Code != wire.CodeInvalidArgument || e.Field != tt.field):
			t.Errorf("%s: %v, want INVALID_ARGUMENT on %s", tt.name, err, tt.field)
		case tt.field != "" && n.Stats().ActiveLeases != before:
			t.Errorf("%s: a refused acquire changed the count", tt.name)
		}
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: strings.Repeat("h", 129), TTLMS: 60000}); !errors.Is(err, &wire.Error{Code: wire.CodeInvalidArgument}) {
		t.Errorf("session holder of 129 bytes: %v", err)
	}
	if _, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "h", TTLMS: 60000, Metadata: meta(17, 100)}); !errors.Is(err, &wire.Error{Code: wire.CodeInvalidArgument}) {
		t.Errorf("session with 17 metadata entries: %v", err)
	}
	if s := n.Stats(); s.ActiveSessions != 0 {
		t.Errorf("%d sessions after refusals", s.ActiveSessions)
	}
}
