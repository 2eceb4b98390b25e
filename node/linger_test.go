package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
)

// TestTickLingersInABusyLog: a tick lingers for a companion as the
// acquires that will queue do, but only in a busy log (its first
// proposal came as the previous entry was answered); a tick with anything
// else, or with an acquire that will be granted, does not.
func TestTickLingersInABusyLog(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	res, _, err := n.propose(ctx, &fsm.Acquire{LeaseID: "ls_a", Key: "k", Holder: "a", Limit: 1,
		TokenHash: hashToken("ls_a"), TTLMS: 60_000, TTLTicks: ticks(60_000, period), WallMS: wallNow().UnixMilli()})
	if err != nil || res.Err != nil {
		t.Fatalf("acquire a: %v %v", err, res.Err)
	}
	hold.Store(true)
	queuing := &fsm.Acquire{LeaseID: "x1", Key: "k", Holder: "x1", Limit: 1, TokenHash: hashToken("x1"),
		TTLMS: 60_000, TTLTicks: ticks(60_000, period), WaitTicks: ticks(30_000, period)}
	free := &fsm.Acquire{LeaseID: "x2", Key: "free", Holder: "x2", Limit: 1, TokenHash: hashToken("x2"),
		TTLMS: 60_000, TTLTicks: ticks(60_000, period), WaitTicks: ticks(30_000, period)}
	tick := &fsm.Tick{Tick: 1 << 40, PeriodMS: tickLingerPeriod.Milliseconds()}
	short := &fsm.Tick{Tick: 1 << 40, PeriodMS: tickLingerPeriod.Milliseconds() - 1}
	lingers := func(busy bool, cmds ...fsm.Command) bool {
		var b []*proposal
		for _, c := range cmds {
			b = append(b, &proposal{cmd: c})
		}
		return n.gc.lingers(b, busy)
	}
	for _, c := range []struct {
		name string
		busy bool
		cmds []fsm.Command
		want bool
	}{
		{"a tick in a busy log", true, []fsm.Command{tick}, true},
		{"a tick in a quiet log", false, []fsm.Command{tick}, false},
		{"a tick of a short period in a busy log", true, []fsm.Command{short}, false},
		{"a tick of a short period and a queuing acquire", true, []fsm.Command{queuing, short}, false},
		{"a tick and a queuing acquire in a busy log", true, []fsm.Command{queuing, tick}, true},
		{"a tick and a queuing acquire in a quiet log", false, []fsm.Command{tick, queuing}, false},
		{"a queuing acquire in a quiet log", false, []fsm.Command{queuing}, true},
		{"a tick and an acquire on a free key", true, []fsm.Command{tick, free}, false},
		{"a tick and a release", true, []fsm.Command{tick, &fsm.Release{LeaseID: "ls_a", TokenHash: hashToken("ls_a")}}, false},
	} {
		if got := lingers(c.busy, c.cmds...); got != c.want {
			t.Errorf("%s: lingers %v, want %v", c.name, got, c.want)
		}
	}
}

// TestContendedGrantsTakeAnEntryEach: in a chain of hand-offs on one key,
// each with a tick of the busy log among them, the tick, the next
// waiter's acquire and the holder's release share one entry: N grants take
// N entries. The tick and the others are queued by hand, in order; the
// clock is held so that no other tick comes, the log counts as busy, and
// the linger is a minute long, so that the count does not depend on
// timing.
func TestContendedGrantsTakeAnEntryEach(t *testing.T) {
	var hold, busy atomic.Bool
	cfg := testConfig(t, "")
	cfg.lingerMax = time.Minute
	cfg.busyLog = busy.Load // once the clock is held, a busy log
	cfg.TickPeriod = tickLingerPeriod
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	retain := uint64((cfg.Retention + period - 1) / period)
	acquire := func(id string, wait bool) *fsm.Acquire { return testAcquire(id, "k", period, wait) }
	res, _, err := n.propose(ctx, acquire("ls_h0", false))
	if err != nil || res.Err != nil {
		t.Fatalf("acquire h0: %v %v", err, res.Err)
	}
	hold.Store(true)
	busy.Store(true)
	quiet := func() { waitQuiet(t, n, period) }
	const grants = 3
	holder := "ls_h0"
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("no chain of hand-offs took an entry per grant in 5 tries")
		}
		quiet()
		first := n.rep.pos.Load()
		shared := true
		for g := range grants {
			n.rep.mu.RLock()
			next := n.rep.f.Tick() + 1
			n.rep.mu.RUnlock()
			pt := newProposal(ctx, &fsm.Tick{Tick: next, WallMS: wallNow().UnixMilli(),
				PeriodMS: period.Milliseconds(), RetainTicks: retain})
			n.gc.propCh <- pt
			r, returned := lingerOrAnswer(t, n, pt.done)
			if returned {
				// Without the linger, or something else (the leader's own
				// bookkeeping) came with it.
				t.Logf("try %d, grant %d: the tick did not linger (%v at %d)", try, g, r.err, r.index)
				shared = false
				break
			}
			waiter := fmt.Sprintf("ls_w%d_%d", try, g)
			pw := newProposal(ctx, acquire(waiter, true))
			pr := newProposal(ctx, &fsm.Release{LeaseID: holder, TokenHash: hashToken(holder), WallMS: wallNow().UnixMilli()})
			n.gc.propCh <- pw
			n.gc.propCh <- pr
			rt, rw, rr := <-pt.done, <-pw.done, <-pr.done
			for _, o := range []propResult{rt, rw, rr} {
				if o.err != nil || o.res.Err != nil {
					t.Fatalf("try %d, grant %d: %v %v", try, g, o.err, o.res.Err)
				}
			}
			if !rw.res.Queued {
				t.Fatalf("try %d, grant %d: %s was not queued behind %s", try, g, waiter, holder)
			}
			n.rep.mu.RLock()
			l := n.rep.f.Lease(waiter)
			n.rep.mu.RUnlock()
			if l == nil || l.State != fsm.StateActive {
				t.Fatalf("try %d, grant %d: after the release %s is %+v, want active", try, g, waiter, l)
			}
			holder = waiter
			if rt.index != rw.index || rw.index != rr.index {
				t.Logf("try %d, grant %d: the tick went out at %d, the acquire at %d, the release at %d", try, g, rt.index, rw.index, rr.index)
				shared = false
				break
			}
		}
		if !shared {
			continue
		}
		if got := n.rep.pos.Load() - first; got != grants {
			t.Logf("try %d: %d grants took %d entries", try, grants, got)
			continue
		}
		return
	}
}

// TestLingeringAtShutdownNotApplied: an entry still waiting for a
// companion when the node shuts down never reaches Raft, and its
// proposers are answered as those still queued are (shutting down, not
// applied), not left to an entry that may or may not be applied.
func TestLingeringAtShutdownNotApplied(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.lingerMax = time.Minute
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	acquire := func(id string, wait bool) *fsm.Acquire { return testAcquire(id, "k", period, wait) }
	res, _, err := n.propose(ctx, acquire("ls_a", false))
	if err != nil || res.Err != nil {
		t.Fatalf("acquire a: %v %v", err, res.Err)
	}
	hold.Store(true)
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("no acquire lingered in 5 tries")
		}
		id := fmt.Sprintf("ls_b%d", try)
		p := newProposal(ctx, acquire(id, true))
		n.gc.propCh <- p
		r, returned := lingerOrAnswer(t, n, p.done)
		if returned {
			// Something else (the leader's own bookkeeping) shared the entry.
			t.Logf("try %d: %s did not linger (%v at %d)", try, id, r.err, r.index)
			continue
		}
		n.Close()
		r = <-p.done
		if r.err == nil || r.err.Error() != errShuttingDown().Error() {
			t.Fatalf("the lingering acquire at shutdown: %v %v at %d, want %v", r.err, r.res.Err, r.index, errShuttingDown())
		}
		n.rep.mu.RLock()
		l := n.rep.f.Lease(id)
		n.rep.mu.RUnlock()
		if l != nil {
			t.Fatalf("%s was applied: %+v", id, l)
		}
		return
	}
}

// TestAcquireAtWaiterLimitDoesNotLinger: an acquire that its key's waiter
// limit will refuse is answered at once, not after a wait for a
// companion; one under the limit waits.
func TestAcquireAtWaiterLimitDoesNotLinger(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	acquire := func(id string, wait bool, keyWaiters uint64) *fsm.Acquire {
		a := testAcquire(id, "k", period, wait)
		a.Quota.KeyWaiters = keyWaiters
		return a
	}
	hold.Store(true)
	for _, c := range []*fsm.Acquire{acquire("ls_a", false, 1), acquire("ls_w", true, 1)} {
		res, _, err := n.propose(ctx, c)
		if err != nil || res.Err != nil {
			t.Fatalf("acquire %s: %v %v", c.LeaseID, err, res.Err)
		}
		if c.WaitTicks > 0 && !res.Queued {
			t.Fatalf("%s was not queued", c.LeaseID)
		}
	}
	lingers := func(a *fsm.Acquire) bool { return n.gc.lingers([]*proposal{{cmd: a}}, false) }
	if lingers(acquire("x1", true, 1)) {
		t.Error("an acquire its key's waiter limit refuses lingers")
	}
	if !lingers(acquire("x1", true, 2)) {
		t.Error("an acquire under its key's waiter limit does not linger")
	}
	if !lingers(acquire("x1", true, 0)) {
		t.Error("an acquire without a waiter limit does not linger")
	}
}
