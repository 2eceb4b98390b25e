package node

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestRaftErrorNotAppended: Raft errors that prove the entry was never
// appended (the leader refused it while handing leadership on, or it could
// not even be queued in time) are "did not happen", 503 UNAVAILABLE (the
// API adds Retry-After to every 503), not 504 INDETERMINATE; a lost
// leadership stays INDETERMINATE.
func TestRaftErrorNotAppended(t *testing.T) {
	for _, c := range []struct {
		err  error
		want wire.Code
	}{
		{raft.ErrNotLeader, wire.CodeNoLeader},
		{raft.ErrEnqueueTimeout, wire.CodeUnavailable},
		{raft.ErrLeadershipTransferInProgress, wire.CodeUnavailable},
		{fmt.Errorf("apply: %w", raft.ErrLeadershipTransferInProgress), wire.CodeUnavailable},
		{raft.ErrLeadershipLost, wire.CodeIndeterminate},
		{raft.ErrRaftShutdown, wire.CodeIndeterminate},
	} {
		e := raftError(c.err)
		if e.Code != c.want {
			t.Errorf("%v: %s, want %s", c.err, e.Code, c.want)
		}
		if c.want == wire.CodeUnavailable && wire.HTTPStatus(e.Code) != 503 {
			t.Errorf("%v: status %d, want 503", c.err, wire.HTTPStatus(e.Code))
		}
	}
}

// fakeApplyFuture is a failed Apply.
type fakeApplyFuture struct{ err error }

func (f fakeApplyFuture) Error() error  { return f.err }
func (f fakeApplyFuture) Index() uint64 { return 0 }
func (f fakeApplyFuture) Response() any { return nil }

// TestProposeAnswersTransferAsUnavailable: a batch that Raft refused during
// a leadership transfer answers each of its proposers UNAVAILABLE.
func TestProposeAnswersTransferAsUnavailable(t *testing.T) {
	n := &Node{stats: newCounters()}
	n.gc = groupCommit{stats: n.stats, inflight: make(chan struct{}, 1)}
	n.gc.inflight <- struct{}{}
	ps := []*proposal{{cmd: &fsm.Tick{}, start: time.Now(), done: make(chan propResult, 1)},
		{cmd: &fsm.Tick{}, start: time.Now(), done: make(chan propResult, 1)}}
	n.gc.await(fakeApplyFuture{raft.ErrLeadershipTransferInProgress}, ps)
	for i, p := range ps {
		r := <-p.done
		if wire.ErrorCode(r.err) != wire.CodeUnavailable {
			t.Fatalf("proposal %d: %v, want UNAVAILABLE", i, r.err)
		}
	}
}

// testAcquire is an acquire of key by lease id (its own holder and
// token), one slot, a minute's TTL, that waits 30 s for the key when wait.
func testAcquire(id, key string, period time.Duration, wait bool) *fsm.Acquire {
	a := &fsm.Acquire{LeaseID: id, Key: key, Holder: id, Limit: 1, TokenHash: hashToken(id),
		TTLMS: 60_000, TTLTicks: ticks(60_000, period), WallMS: wallNow().UnixMilli()}
	if wait {
		a.WaitTicks = ticks(30_000, period)
	}
	return a
}

// waitQuiet waits until n's log has had no new entry for five periods.
func waitQuiet(t *testing.T, n *Node, period time.Duration) {
	t.Helper()
	last, still := n.rep.pos.Load(), 0
	waitFor(t, 30*time.Second, func() bool {
		time.Sleep(period) // quiet is no new entry for five periods: the wait is what is checked
		if a := n.rep.pos.Load(); a != last {
			last, still = a, 0
			return false
		}
		still++
		return still >= 5
	})
}

// lingerOrAnswer waits until the batcher holds an entry for a companion
// (false) or answer comes first (its value, true).
func lingerOrAnswer[T any](t *testing.T, n *Node, answer <-chan T) (T, bool) {
	t.Helper()
	var v T
	returned := false
	waitFor(t, 10*time.Second, func() bool {
		if n.gc.lingering.Load() {
			return true
		}
		select {
		case v = <-answer:
			returned = true
			return true
		default:
			return false
		}
	})
	return v, returned
}

// TestHandOffSharesAnEntry: an entry holding only acquires that will queue
// waits for a companion, so that the holder's release, proposed a moment
// later, shares the entry instead of waiting behind it; a waiting acquire
// on a free key, or one that may not wait, does not linger. The clock is
// held so that no tick joins the entry, and the linger is long, so that
// the verdict does not depend on how soon the release follows.
func TestHandOffSharesAnEntry(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.lingerMax = time.Minute
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	acquire := func(id, key string, wait bool) *fsm.Acquire { return testAcquire(id, key, period, wait) }
	res, _, err := n.propose(ctx, acquire("ls_a", "k", false))
	if err != nil || res.Err != nil {
		t.Fatalf("acquire a: %v %v", err, res.Err)
	}
	hold.Store(true)

	// The decision itself.
	lingers := func(cmds ...fsm.Command) bool {
		var b []*proposal
		for _, c := range cmds {
			b = append(b, &proposal{cmd: c})
		}
		return n.gc.lingers(b, false)
	}
	if !lingers(acquire("x1", "k", true), acquire("x2", "k", true)) {
		t.Error("waiting acquires on a held key do not linger")
	}
	if lingers(acquire("x1", "k", false)) {
		t.Error("an acquire that may not wait lingers")
	}
	if lingers(acquire("x1", "free", true)) {
		t.Error("a waiting acquire on a free key lingers")
	}
	if lingers(acquire("x1", "k", true), &fsm.Release{LeaseID: "ls_a", TokenHash: hashToken("ls_a")}) {
		t.Error("an entry with a release lingers")
	}

	// The hand-off: b queues behind a, a releases; both in one entry.
	// Another proposal arriving while b lingers (a tick proposed before
	// the clock was held, the leader's own bookkeeping) ends the linger
	// first: then try again, on a fresh key, once the log is quiet.
	quiet := func() { waitQuiet(t, n, period) }
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("no hand-off shared an entry in 5 tries")
		}
		a, b, key := fmt.Sprintf("ls_a%d", try), fmt.Sprintf("ls_b%d", try), fmt.Sprintf("h%d", try)
		res, _, err := n.propose(ctx, acquire(a, key, false))
		if err != nil || res.Err != nil {
			t.Fatalf("acquire %s: %v %v", a, err, res.Err)
		}
		quiet()
		type out struct {
			res   fsm.Result
			index uint64
			err   error
		}
		got := make(chan out, 1)
		go func() {
			r, i, err := n.propose(ctx, acquire(b, key, true))
			got <- out{r, i, err}
		}()
		ob, returned := lingerOrAnswer(t, n, got)
		if returned {
			if ob.err != nil || ob.res.Err != nil {
				t.Fatalf("acquire %s: %v %v", b, ob.err, ob.res.Err)
			}
			t.Logf("try %d: %s did not linger", try, b)
			continue
		}
		res, ri, err := n.propose(ctx, &fsm.Release{LeaseID: a, TokenHash: hashToken(a), WallMS: wallNow().UnixMilli()})
		if err != nil || res.Err != nil {
			t.Fatalf("release %s: %v %v", a, err, res.Err)
		}
		ob = <-got
		if ob.err != nil || ob.res.Err != nil {
			t.Fatalf("acquire %s: %v %v", b, ob.err, ob.res.Err)
		}
		n.rep.mu.RLock()
		l := n.rep.f.Lease(b)
		n.rep.mu.RUnlock()
		if l == nil || l.State != fsm.StateActive {
			t.Fatalf("after the release %s is %+v, want active", b, l)
		}
		if ob.index != ri {
			t.Logf("try %d: the waiting acquire went out at index %d, the release at %d", try, ob.index, ri)
			continue
		}
		return
	}
}

// TestRenewalsOfAnEntryShareTheNext: after an entry that renewed two
// leases, a renewal of one waits for the other's, which then shares its
// entry; after an entry of anything else, or of one lease, a renewal goes
// at once. The batcher is paused (its one entry slot taken) so that the
// first two renewals share an entry, the clock is held so that no tick
// joins them, and the wait is long, so that the verdict does not depend on
// how soon the second renewal follows. With shutdown, the node closes
// while the renewal waits: it is answered as the queued proposals are
// (shutting down, not applied) and no entry carries it.
func TestRenewalsOfAnEntryShareTheNext(t *testing.T) {
	t.Run("companion", func(t *testing.T) { testRenewalsShareTheNext(t, false) })
	t.Run("shutdown", func(t *testing.T) { testRenewalsShareTheNext(t, true) })
}

func testRenewalsShareTheNext(t *testing.T, shutdown bool) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.renewLinger = time.Minute
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	acquire := func(id string) *fsm.Acquire { return testAcquire(id, id, period, false) }
	renew := func(id string) *fsm.Renew {
		return &fsm.Renew{LeaseID: id, TokenHash: hashToken(id), WallMS: wallNow().UnixMilli()}
	}
	type out struct {
		index uint64
		err   error
	}
	propose := func(c fsm.Command) <-chan out {
		got := make(chan out, 1)
		go func() {
			res, i, err := n.propose(ctx, c)
			if err == nil && res.Err != nil {
				err = res.Err
			}
			got <- out{i, err}
		}()
		return got
	}
	for _, id := range []string{"ls_a", "ls_b"} {
		if o := <-propose(acquire(id)); o.err != nil {
			t.Fatalf("acquire %s: %v", id, o.err)
		}
	}
	hold.Store(true)
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("no renewal waited for its companion in 5 tries")
		}
		// Both renewals in one entry: queued (by hand, in order) while
		// the entry before them is applied, which the replica's lock
		// holds up.
		// The acquire is queued by hand too, before them: proposed from a
		// goroutine it could reach the queue after them, and its entry then
		// came between the two renewals' and the next.
		n.rep.mu.Lock()
		before := newProposal(ctx, acquire(fmt.Sprintf("ls_x%d", try)))
		n.gc.propCh <- before
		waitFor(t, 10*time.Second, func() bool { return len(n.gc.propCh) == 0 })
		pa, pb := newProposal(ctx, renew("ls_a")), newProposal(ctx, renew("ls_b"))
		n.gc.propCh <- pa
		n.gc.propCh <- pb
		n.rep.mu.Unlock()
		if r := <-before.done; cmp.Or(r.err, errOf(r.res)) != nil {
			t.Fatalf("acquire: %v", cmp.Or(r.err, errOf(r.res)))
		}
		ra, rb := <-pa.done, <-pb.done
		oa, ob := out{ra.index, cmp.Or(ra.err, errOf(ra.res))}, out{rb.index, cmp.Or(rb.err, errOf(rb.res))}
		if oa.err != nil || ob.err != nil {
			t.Fatalf("renewals: %v, %v", oa.err, ob.err)
		}
		if oa.index != ob.index {
			t.Logf("try %d: the first renewals went out at %d and %d", try, oa.index, ob.index)
			continue
		}
		// Then a renewal of one waits for the other's.
		a := propose(renew("ls_a"))
		o, returned := lingerOrAnswer(t, n, a)
		if returned {
			// Something else (the leader's own bookkeeping) shared the
			// entry or ended the wait.
			t.Logf("try %d: the renewal did not wait (%v at %d)", try, o.err, o.index)
			continue
		}
		if shutdown {
			last := n.rep.pos.Load()
			n.Close()
			if o = <-a; o.err == nil || o.err.Error() != errShuttingDown().Error() {
				t.Fatalf("the waiting renewal at shutdown: %v at %d, want %v", o.err, o.index, errShuttingDown())
			}
			if got := n.rep.pos.Load(); got != last {
				t.Fatalf("entries %d..%d were applied after the close; the waiting renewal must not reach Raft", last+1, got)
			}
			return
		}
		b := propose(renew("ls_b"))
		oa, ob = <-a, <-b
		if oa.err != nil || ob.err != nil {
			t.Fatalf("renewals: %v, %v", oa.err, ob.err)
		}
		if oa.index != ob.index {
			t.Logf("try %d: the waiting renewal went out at %d, its companion at %d", try, oa.index, ob.index)
			continue
		}
		break
	}
	// An entry of something else, then of one lease: renewals go at once
	// (within the minute-long wait, the ctx's bound).
	if o := <-propose(acquire("ls_c")); o.err != nil {
		t.Fatalf("acquire ls_c: %v", o.err)
	}
	for i := range 2 {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		res, _, err := n.propose(c, renew("ls_a"))
		cancel()
		if err != nil || res.Err != nil {
			t.Fatalf("lone renewal %d: %v %v", i, err, res.Err)
		}
	}
}

// errOf is res's error as an error (nil for none).
func errOf(res fsm.Result) error {
	if res.Err == nil {
		return nil
	}
	return res.Err
}
