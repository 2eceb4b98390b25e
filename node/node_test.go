package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// testConfig is a fast single-node configuration: in-memory unless dir is
// set, 20ms ticks, TTLs down to 50ms.
func testConfig(_ testing.TB, dir string) Config {
	cfg := DefaultConfig()
	cfg.NodeID = "n1"
	cfg.TickPeriod = 20 * time.Millisecond
	cfg.MinTTL = 50 * time.Millisecond
	cfg.ApplyTimeout = 5 * time.Second
	if dir == "" {
		cfg.InMemory = true
		cfg.DataDir = ""
		cfg.RaftAddr = ""
	} else {
		cfg.DataDir = dir
		cfg.RaftAddr = "127.0.0.1:0"
		// Not the default port: other packages' tests run at the same
		// time and may hold it.
		cfg.GossipAddr = "127.0.0.1:0"
	}
	return cfg
}

func openNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("node not ready within 10s")
	}
	// Wait for leadership barrier so linearizable reads work.
	waitFor(t, 5*time.Second, func() bool { return n.lt.isReady() })
	return n
}

func waitFor(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		<-time.After(2 * time.Millisecond)
	}
}

func TestAcquireReleaseExclusive(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	l, replayed, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "a", TTLMS: 5000})
	if err != nil || replayed {
		t.Fatalf("acquire: %v %v", err, replayed)
	}
	if l.Token == "" || l.FencingToken == 0 || l.State != "active" || l.RemainingMS < 5000 {
		t.Fatalf("bad lease %+v", l)
	}
	_, _, err = n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "b", TTLMS: 5000})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeLeaseHeld || len(e.Holders) != 1 || e.Holders[0].LeaseID != l.LeaseID {
		t.Fatalf("second acquire: %v", err)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: "wrong"}); wire.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("release with wrong token: %v", err)
	}
	rl, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token, Reason: "done"})
	if err != nil || rl.State != "released" || rl.EndReason != "done" {
		t.Fatalf("release: %v %+v", err, rl)
	}
	l2, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "b", TTLMS: 5000})
	if err != nil || l2.FencingToken <= l.FencingToken {
		t.Fatalf("reacquire: %v %+v", err, l2)
	}
	got, err := n.GetLease(ctx, l.LeaseID, false)
	if err != nil || got.State != "released" || got.Token != "" {
		t.Fatalf("get: %v %+v", err, got)
	}
}

func TestSemaphoreUnderConcurrency(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	var mu sync.Mutex
	granted, held := 0, 0
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuner", Holder: fmt.Sprint("w", i), TTLMS: 5000, Limit: 3})
			mu.Lock()
			defer mu.Unlock()
			switch wire.ErrorCode(err) {
			case "":
				granted++
			case wire.CodeLeaseHeld:
				held++
			default:
				t.Errorf("acquire: %v", err)
			}
		}()
	}
	wg.Wait()
	if granted != 3 || held != 37 {
		t.Fatalf("granted %d held %d, want 3 and 37", granted, held)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuner", Holder: "x", TTLMS: 5000, Limit: 2}); wire.ErrorCode(err) != wire.CodeLimitMismatch {
		t.Fatalf("limit mismatch: %v", err)
	}
}

func TestExpiryNotEarlyAndWithinTwoTicks(t *testing.T) {
	cfg := testConfig(t, "")
	n := openNode(t, cfg)
	ctx := context.Background()
	sub, err := n.Subscribe(ctx, wire.EventFilter{Key: "exp"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ttl := 200 * time.Millisecond
	sent := time.Now()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "exp", Holder: "a", TTLMS: ttl.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	var acquiredTick uint64
	for ev := range sub.Events() {
		if ev.Type == "acquired" {
			acquiredTick = ev.Tick
			continue
		}
		if ev.Type != "expired" {
			continue
		}
		took := time.Since(sent)
		if ev.Lease.LeaseID != l.LeaseID || ev.Lease.State != "expired" {
			t.Fatalf("bad expired event %+v", ev)
		}
		// Never early, on the real clock: ticks never run ahead of it.
		if took < ttl {
			t.Fatalf("expired after %v, before its TTL %v", took, ttl)
		}
		// At most two ticks of grace, counted in the leader's ticks. How
		// late those ticks come in real time depends on the machine (a
		// saturated one under -race issues them late), so the real-time
		// bound is only a generous one.
		if acquiredTick == 0 {
			t.Fatal("no acquired event before the expiry")
		}
		if ticks, limit := ev.Tick-acquiredTick, uint64(ttl/cfg.TickPeriod)+2; ticks > limit {
			t.Fatalf("expired %d ticks after the grant, later than %d (TTL %v, tick %v)", ticks, limit, ttl, cfg.TickPeriod)
		}
		if limit := ttl + 10*time.Second; took > limit {
			t.Fatalf("expired after %v, later than %v", took, limit)
		}
		if _, err := n.Renew(ctx, l.LeaseID, l.Token, 0); wire.ErrorCode(err) != wire.CodeLeaseExpired {
			t.Fatalf("renew after expiry: %v", err)
		}
		return
	}
	t.Fatalf("subscription ended: %v", sub.Err())
}

func TestRenewKeepsAlive(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	// Renewed every 40 ms for 1.5 times its TTL. The TTL leaves room for a
	// loaded machine to delay a renewal by most of a second: only a gap
	// longer than the TTL lets the lease end legitimately.
	ttl := 1200 * time.Millisecond
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "r", Holder: "a", TTLMS: ttl.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(ttl * 3 / 2)
	count := 0
	for time.Now().Before(deadline) {
		rl, err := n.Renew(ctx, l.LeaseID, l.Token, 0)
		if err != nil {
			t.Fatalf("renew %d: %v", count, err)
		}
		count++
		if rl.RenewalCount != uint32(count) {
			t.Fatalf("renewal count %d, want %d", rl.RenewalCount, count)
		}
		<-time.After(40 * time.Millisecond)
	}
	if _, err := n.Renew(ctx, l.LeaseID, "bad", 0); wire.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("renew bad token: %v", err)
	}
}

func TestIdempotentAcquire(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "svc", Holder: "gw", TTLMS: 5000, IdempotencyKey: "k1", Metadata: map[string]string{"a": "b"}}
	var wg sync.WaitGroup
	results := make([]*wire.Lease, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _, errs[i] = n.Acquire(ctx, req)
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("acquire %d: %v", i, errs[i])
		}
		if results[i].LeaseID != results[0].LeaseID || results[i].Token != results[0].Token || results[i].Token == "" {
			t.Fatalf("replay %d gave %s/%q, want %s/%q", i, results[i].LeaseID, results[i].Token, results[0].LeaseID, results[0].Token)
		}
	}
	req.TTLMS = 6000
	if _, _, err := n.Acquire(ctx, req); wire.ErrorCode(err) != wire.CodeIdempotencyConflict {
		t.Fatalf("different request: %v", err)
	}
}

func TestWaitFIFOAndLockDelay(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	first, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "a", TTLMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		holder string
		l      *wire.Lease
		err    error
	}
	out := make(chan res, 3)
	for _, h := range []string{"b", "c", "d"} {
		go func() {
			l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: h, TTLMS: 5000, WaitMS: 5000})
			out <- res{h, l, err}
		}()
		// Enqueue in a known order: wait until this waiter is registered.
		waitFor(t, 2*time.Second, func() bool {
			n.waits.mu.Lock()
			defer n.waits.mu.Unlock()
			return len(n.waits.m) >= int(h[0]-'a')
		})
	}
	prev := first
	for _, want := range []string{"b", "c", "d"} {
		if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: prev.LeaseID, Token: prev.Token}); err != nil {
			t.Fatal(err)
		}
		r := <-out
		if r.err != nil || r.holder != want || r.l.Holder != want || r.l.Token == "" {
			t.Fatalf("got %+v, want grant to %s", r, want)
		}
		if r.l.FencingToken <= prev.FencingToken {
			t.Fatalf("fence did not increase")
		}
		prev = r.l
	}

	// Lock-delay: an involuntary end blocks the slot.
	// The delay must outlast the Revoke-to-Acquire gap on a loaded machine.
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "ld", Holder: "a", TTLMS: 5000, LockDelayMS: 1500})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Revoke(ctx, l.LeaseID, "maintenance"); err != nil {
		t.Fatal(err)
	}
	_, _, err = n.Acquire(ctx, wire.AcquireRequest{Key: "ld", Holder: "b", TTLMS: 5000})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeLockDelay || e.RemainingMS <= 0 {
		t.Fatalf("acquire during lock-delay: %v (%d)", err, e.RemainingMS)
	}
	waitFor(t, 10*time.Second, func() bool {
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "ld", Holder: "b", TTLMS: 5000})
		return err == nil
	})
}

func TestSessionsBindLeases(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	// Heartbeats 40 ms apart keep a 1 s session: a loaded machine would
	// have to delay one by most of a second to end it legitimately.
	s, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "runner-1", TTLMS: 1000, Metadata: map[string]string{"v": "1"}})
	if err != nil || s.Token == "" {
		t.Fatalf("create session: %v", err)
	}
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/9", SessionID: s.SessionID, SessionToken: s.Token})
	if err != nil || l.Holder != "runner-1" || l.SessionID != s.SessionID {
		t.Fatalf("bound acquire: %v %+v", err, l)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/8", SessionID: s.SessionID, SessionToken: "nope"}); wire.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("bad session token: %v", err)
	}
	// Heartbeats for 1.5 times the session's TTL.
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
		if _, err := n.SessionHeartbeat(ctx, s.SessionID, s.Token); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		<-time.After(40 * time.Millisecond)
	}
	if got, _ := n.GetLease(ctx, l.LeaseID, false); got.State != "active" {
		t.Fatalf("bound lease ended while heartbeating: %+v", got)
	}
	waitFor(t, 10*time.Second, func() bool {
		got, _ := n.GetLease(ctx, l.LeaseID, false)
		return got.State == "expired"
	})
	got, _ := n.GetLease(ctx, l.LeaseID, false)
	if got.EndReason != "session_ended" {
		t.Fatalf("end reason %q", got.EndReason)
	}
	if _, err := n.SessionHeartbeat(ctx, s.SessionID, s.Token); wire.ErrorCode(err) != wire.CodeSessionEnded {
		t.Fatalf("late heartbeat: %v", err)
	}
	if n.Stats().LateHeartbeats != 1 || n.Stats().SessionsExpired != 1 {
		t.Fatalf("stats %+v", n.Stats())
	}
}

func TestEventsResume(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	var ids []string
	sub, _ := n.Subscribe(ctx, wire.EventFilter{Prefix: "ev/"})
	for i := range 3 {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("ev/", i), Holder: "a", TTLMS: 5000})
		if err != nil {
			t.Fatal(err)
		}
		ev := <-sub.Events()
		if ev.Type != "acquired" || ev.Lease.LeaseID != l.LeaseID || ev.Lease.Token != "" {
			t.Fatalf("event %+v", ev)
		}
		ids = append(ids, ev.ID)
	}
	sub.Close()
	again, err := n.Subscribe(ctx, wire.EventFilter{Prefix: "ev/", After: ids[0]})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for _, want := range ids[1:] {
		if ev := <-again.Events(); ev.ID != want {
			t.Fatalf("resumed event %s, want %s", ev.ID, want)
		}
	}
	if _, err := n.Subscribe(ctx, wire.EventFilter{After: "x-y"}); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("bad id: %v", err)
	}
}

// TestEventsRenderedOnce: subscribers of one event share one rendering of
// it (the fan-out to a thousand streams must not render it a thousand
// times), and it is the same as what a lone subscriber sees.
func TestEventsRenderedOnce(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	var subs []*Subscription
	for range 3 {
		sub, err := n.Subscribe(ctx, wire.EventFilter{Key: "once"})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		subs = append(subs, sub)
	}
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "once", Holder: "a", TTLMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	var first wire.Event
	for i, sub := range subs {
		ev := <-sub.Events()
		if ev.Type != "acquired" || ev.Lease == nil || ev.Lease.LeaseID != l.LeaseID || ev.Lease.Token != "" {
			t.Fatalf("subscriber %d: event %+v", i, ev)
		}
		if i == 0 {
			first = ev
			continue
		}
		if ev.Lease != first.Lease || ev.ID != first.ID {
			t.Fatalf("subscriber %d got its own rendering (%p, %s), want the shared one (%p, %s)", i, ev.Lease, ev.ID, first.Lease, first.ID)
		}
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	before := n.AppliedIndex()
	cases := []wire.AcquireRequest{
		{Key: "", Holder: "a", TTLMS: 1000},
		{Key: "k\x01", Holder: "a", TTLMS: 1000},
		{Key: "k", Holder: "", TTLMS: 1000},
		{Key: "k", Holder: "a", TTLMS: 1},
		{Key: "k", Holder: "a", TTLMS: 1000, Limit: fsm.MaxLimit + 1},
		{Key: "k", Holder: "a", TTLMS: 1000, WaitMS: -1},
		{Key: "k", Holder: "a", TTLMS: 1000, Metadata: map[string]string{"": "x"}},
	}
	for i, c := range cases {
		if _, _, err := n.Acquire(ctx, c); wire.ErrorCode(err) != wire.CodeInvalidArgument {
			t.Errorf("case %d: %v", i, err)
		}
	}
	if _, err := n.GetLease(ctx, "", false); wire.ErrorCode(err) != wire.CodeLeaseNotFound {
		t.Errorf("empty id: %v", err)
	}
	// Ticks may have advanced the index; no lease may exist.
	list, err := n.ListLeases(ctx, wire.ListRequest{}, false)
	if err != nil || len(list.Leases) != 0 {
		t.Fatalf("leases after bad input: %v %+v (index %d -> %d)", err, list, before, n.AppliedIndex())
	}
}

func TestRestartKeepsLeases(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-n.Ready()
	waitFor(t, 5*time.Second, n.lt.isReady)
	ctx := context.Background()
	kept, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "durable", Holder: "a", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	gone, _, _ := n.Acquire(ctx, wire.AcquireRequest{Key: "released", Holder: "a", TTLMS: 60000})
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: gone.LeaseID, Token: gone.Token}); err != nil {
		t.Fatal(err)
	}
	n.Close()
	n2 := openNode(t, cfg)
	got, err := n2.GetLease(ctx, kept.LeaseID, false)
	if err != nil || got.State != "active" || got.FencingToken != kept.FencingToken {
		t.Fatalf("after restart: %v %+v", err, got)
	}
	if got.RemainingMS > kept.RemainingMS {
		t.Fatalf("remaining grew across restart: %d > %d", got.RemainingMS, kept.RemainingMS)
	}
	if g, _ := n2.GetLease(ctx, gone.LeaseID, false); g == nil || g.State != "released" {
		t.Fatalf("released lease after restart: %+v", g)
	}
	if _, err := n2.Renew(ctx, kept.LeaseID, kept.Token, 0); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	l3, _, err := n2.Acquire(ctx, wire.AcquireRequest{Key: "released", Holder: "b", TTLMS: 1000})
	if err != nil || l3.FencingToken <= gone.FencingToken {
		t.Fatalf("fence after restart: %v %+v", err, l3)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	bad := []func(*Config){
		func(c *Config) { c.NodeID = "" },
		func(c *Config) { c.DataDir = "" },
		func(c *Config) { c.TickPeriod = time.Millisecond },
		func(c *Config) { c.MinTTL = -1 },
		func(c *Config) { c.MaxTTL = c.MinTTL - 1 },
		func(c *Config) { c.MaxBatch = -1 },
		func(c *Config) { c.BootstrapExpect = 3 }, // without join addresses
		func(c *Config) { c.GossipKey = []byte("short") },
		func(c *Config) { c.MinQuorum = -1 },
		func(c *Config) { c.RaftTLS = &cluster.TLSConfig{} }, // no certificate, no CAs
	}
	for i, mutate := range bad {
		c := DefaultConfig()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: invalid config accepted", i)
		}
		if _, err := Open(c); err == nil {
			t.Errorf("case %d: Open accepted an invalid config", i)
		}
	}
}
