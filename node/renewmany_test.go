package node

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestRenewMany: each renewal of a unit has its own outcome, in the order
// asked: those refused before proposing (no token, the control lease, a
// bad TTL) their own error, the others their result of the one entry (a
// wrong token LEASE_TOKEN_INVALID, the rest renewed); a unit abandoned
// before it is proposed, or proposed to a closed node, renews none.
func TestRenewMany(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	period := n.tk.period()
	for _, id := range []string{"ls_a", "ls_b", "ls_c"} {
		if res, _, err := n.propose(ctx, testAcquire(id, id, period, false)); err != nil || res.Err != nil {
			t.Fatalf("acquire %s: %v %v", id, err, res.Err)
		}
	}
	reqs := []wire.RenewRequest{
		{LeaseID: "ls_a", Token: "ls_a"},
		{LeaseID: "ls_b"},
		{LeaseID: "ls_b", Token: "wrong"},
		{LeaseID: "cl_0123456789", Token: "x"},
		{LeaseID: "ls_c", Token: "ls_c", TTLMS: -1},
		{LeaseID: "ls_c", Token: "ls_c", TTLMS: 30_000},
		{LeaseID: "ls_a", Token: "ls_a"},
	}
	out := make([]Renewed, len(reqs))
	n.RenewMany(ctx, reqs, out)
	want := []wire.Code{"", wire.CodeInvalidArgument, wire.CodeLeaseTokenInvalid, errControlOnly().Code, wire.CodeInvalidArgument, "", ""}
	for i, o := range out {
		if got := wire.ErrorCode(o.Err); got != want[i] || (o.Err == nil) != (o.Lease != nil) {
			t.Errorf("renewal %d (%+v): %v %v, want %q", i, reqs[i], o.Lease, o.Err, want[i])
		}
	}
	if out[0].Lease.RenewalCount != 1 || out[6].Lease.RenewalCount != 2 || out[5].Lease.TTLMS != 30_000 {
		t.Errorf("renewed: %+v, %+v, %+v", out[0].Lease, out[6].Lease, out[5].Lease)
	}

	// Abandoned first, and after the close: nothing renewed, each told.
	done, cancel := context.WithCancel(ctx)
	cancel()
	out = make([]Renewed, 2)
	n.RenewMany(done, []wire.RenewRequest{{LeaseID: "ls_a", Token: "ls_a"}, {LeaseID: "ls_b"}}, out)
	if !errors.Is(out[0].Err, context.Canceled) || wire.ErrorCode(out[1].Err) != wire.CodeInvalidArgument {
		t.Errorf("abandoned: %v, %v", out[0].Err, out[1].Err)
	}
	if l, err := n.GetLease(ctx, "ls_a", true); err != nil || l.RenewalCount != 2 {
		t.Errorf("ls_a: %+v %v, want renewed twice", l, err)
	}
	n.Close()
	n.RenewMany(ctx, []wire.RenewRequest{{LeaseID: "ls_a", Token: "ls_a"}, {LeaseID: "ls_c", Token: "ls_c"}}, out)
	for i, o := range out {
		if o.Err == nil || o.Lease != nil {
			t.Errorf("after the close, renewal %d: %v %v", i, o.Lease, o.Err)
		}
	}
}

// TestUnitOneEntry: a unit goes into one entry with its own result for
// each command, shares it with what queued beside it while it fits
// MaxBatch, and otherwise goes whole into the next entry (never split).
func TestUnitOneEntry(t *testing.T) {
	var hold atomic.Bool
	cfg := testConfig(t, "")
	cfg.MaxBatch = 5
	cfg.holdClock = func(*replica) bool { return hold.Load() }
	n := openNode(t, cfg)
	ctx := context.Background()
	period := n.tk.period()
	ids := []string{"ls_a", "ls_b", "ls_c", "ls_d"}
	for _, id := range ids {
		if res, _, err := n.propose(ctx, testAcquire(id, id, period, false)); err != nil || res.Err != nil {
			t.Fatalf("acquire %s: %v %v", id, err, res.Err)
		}
	}
	hold.Store(true) // no tick entry holds the replica's lock up
	renew := func(id, token string) fsm.Command {
		return &fsm.Renew{LeaseID: id, TokenHash: hashToken(token), WallMS: wallNow().UnixMilli()}
	}
	unit := func(ids ...string) *proposal {
		p := newProposal(ctx, nil)
		for _, id := range ids {
			p.unit = append(p.unit, renew(id, id))
		}
		return p
	}
	check := func(name string, p *proposal, n int) propResult {
		t.Helper()
		r := <-p.done
		if r.err != nil || len(r.unit) != n {
			t.Fatalf("%s: %v, %d results, want %d", name, r.err, len(r.unit), n)
		}
		for i, res := range r.unit {
			if res.Err != nil || res.Lease == nil {
				t.Fatalf("%s: result %d: %+v", name, i, res)
			}
		}
		return r
	}
	for _, tt := range []struct {
		name  string
		sizes [2]int
		share bool
	}{{"fits", [2]int{2, 3}, true}, {"overflows", [2]int{3, 3}, false}} {
		for try := 0; ; try++ {
			if try == 5 {
				t.Fatalf("%s: the units did not queue together in 5 tries", tt.name)
			}
			// Both queued (by hand, in order) while the entry before
			// them is applied, which the replica's lock holds up.
			n.rep.mu.Lock()
			// (An acquire: a renewal would wait for the last entry's.)
			before := newProposal(ctx, testAcquire(fmt.Sprintf("ls_x%s%d", tt.name, try), "x", period, false))
			last := n.cl.LastIndex()
			n.gc.propCh <- before
			// Its entry is in the log: the batcher took nothing more.
			for end := time.Now().Add(10 * time.Second); n.cl.LastIndex() == last && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			taken := n.cl.LastIndex() > last
			p1, p2 := unit(ids[:tt.sizes[0]]...), unit(ids[:tt.sizes[1]]...)
			n.gc.propCh <- p1
			n.gc.propCh <- p2
			n.rep.mu.Unlock()
			rb := <-before.done
			if rb.err != nil {
				t.Fatal(rb.err)
			}
			r1, r2 := check(tt.name+" first", p1, tt.sizes[0]), check(tt.name+" second", p2, tt.sizes[1])
			if !taken || r1.index == rb.index {
				// The entry before did not reach the log in time, or
				// something else came between (the leader's own).
				t.Logf("try %d: the first unit went out at %d, the entry before it at %d", try, r1.index, rb.index)
				continue
			}
			if (r1.index == r2.index) != tt.share {
				t.Errorf("%s: units at %d and %d, want shared %v", tt.name, r1.index, r2.index, tt.share)
			}
			// Each result is its own command's: the second renewal of
			// a lease in one entry counts one more.
			if c1, c2 := r1.unit[0].Lease.RenewalCount, r2.unit[0].Lease.RenewalCount; c2 != c1+1 {
				t.Errorf("%s: renewal counts %d then %d", tt.name, c1, c2)
			}
			break
		}
	}
	// A unit's results through proposeUnit: one index, one per command,
	// a wrong token's its own.
	res, index, err := n.proposeUnit(ctx, []fsm.Command{renew("ls_a", "ls_a"), renew("ls_b", "wrong"), renew("ls_c", "ls_c")})
	if err != nil || index == 0 || len(res) != 3 || res[0].Err != nil || res[1].Err == nil || res[1].Err.Code != wire.CodeLeaseTokenInvalid || res[2].Err != nil {
		t.Fatalf("proposeUnit: %+v at %d, %v", res, index, err)
	}
}

// okApplyFuture is an applied entry with its results.
type okApplyFuture struct{ results []fsm.Result }

func (f okApplyFuture) Error() error  { return nil }
func (f okApplyFuture) Index() uint64 { return 9 }
func (f okApplyFuture) Response() any { return f.results }

// TestAwaitAnswersUnitsWhole: an entry's results are handed out in order,
// a unit taking as many as it has commands; a failed entry, or results
// too few for a unit, fail the whole unit (no answer says applied for
// part of it while the rest says not).
func TestAwaitAnswersUnitsWhole(t *testing.T) {
	n := &Node{stats: newCounters()}
	n.gc = groupCommit{stats: n.stats, inflight: make(chan struct{}, 1)}
	batch := func() []*proposal {
		return []*proposal{{cmd: &fsm.Tick{}, start: time.Now(), done: make(chan propResult, 1)},
			{unit: []fsm.Command{&fsm.Tick{}, &fsm.Tick{}, &fsm.Tick{}}, start: time.Now(), done: make(chan propResult, 1)}}
	}
	res := func(i int) fsm.Result { return fsm.Result{Lease: &fsm.Lease{ID: fmt.Sprint("ls_", i)}} }

	ps := batch()
	n.gc.inflight <- struct{}{}
	n.gc.await(okApplyFuture{[]fsm.Result{res(0), res(1), res(2), res(3)}}, ps)
	if r := <-ps[0].done; r.err != nil || r.res.Lease.ID != "ls_0" || r.index != 9 {
		t.Errorf("single: %+v", r)
	}
	r := <-ps[1].done
	if r.err != nil || len(r.unit) != 3 || r.index != 9 {
		t.Fatalf("unit: %+v", r)
	}
	for i, u := range r.unit {
		if u.Lease.ID != fmt.Sprint("ls_", i+1) {
			t.Errorf("unit result %d: %s", i, u.Lease.ID)
		}
	}

	ps = batch()
	n.gc.inflight <- struct{}{}
	n.gc.await(okApplyFuture{[]fsm.Result{res(0), res(1), res(2)}}, ps)
	if r := <-ps[0].done; r.err != nil {
		t.Errorf("single: %v", r.err)
	}
	if r := <-ps[1].done; wire.ErrorCode(r.err) != wire.CodeInternal || r.unit != nil {
		t.Errorf("unit short of results: %+v", r)
	}

	ps = batch()
	n.gc.inflight <- struct{}{}
	n.gc.await(fakeApplyFuture{errors.New("disk gone")}, ps)
	for i, p := range ps {
		if r := <-p.done; wire.ErrorCode(r.err) != wire.CodeIndeterminate || r.unit != nil {
			t.Errorf("failed entry, proposal %d: %+v", i, r)
		}
	}
}
