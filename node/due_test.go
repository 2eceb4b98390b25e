package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// dueSetup holds a node's clock so that one lease is left due: past its end
// at the current tick, its expiry waiting in the backlog (fsm/expire.go).
type dueSetup struct {
	n      *Node
	hold   atomic.Bool            // hold the clock outright
	target atomic.Pointer[string] // hold it once this lease is due
}

// newDueSetup opens a node whose ticks end one record each (chunk 1) and
// whose leader proposes no tick or Expire entry while held.
func newDueSetup(t *testing.T) *dueSetup {
	d := &dueSetup{}
	cfg := testConfig(t, "")
	cfg.expireChunk = 1
	cfg.holdClock = func(rep *replica) bool {
		if d.hold.Load() {
			return true
		}
		id := d.target.Load()
		if id == nil {
			return false
		}
		rep.mu.RLock()
		defer rep.mu.RUnlock()
		l := rep.f.Lease(*id)
		return l != nil && rep.f.Due(l)
	}
	d.n = openNode(t, cfg)
	return d
}

// makeDue grants a filler lease (an id that sorts first, so that the one
// record the due tick ends is the filler) and then calls grant, both at the
// same tick with the same TTL: when they fall due, the filler ends and the
// lease grant returned stays due, the clock held from then on. It returns
// once that lease is due.
func (d *dueSetup) makeDue(t *testing.T, ttlMS int64, grant func() string) string {
	t.Helper()
	ctx := context.Background()
	n := d.n
	d.hold.Store(true)
	var id string
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatal("could not grant two leases at one tick with the clock held")
		}
		fid := fmt.Sprintf("a%02d", try)
		res, _, err := n.propose(ctx, &fsm.Acquire{LeaseID: fid, Key: "filler/" + fid, Holder: "filler", Limit: 1,
			TokenHash: hashToken("filler"), TTLMS: ttlMS, TTLTicks: ticks(ttlMS, n.tk.period()), WallMS: wallNow().UnixMilli()})
		if err != nil || res.Err != nil {
			t.Fatalf("filler: %v %v", err, res.Err)
		}
		id = grant()
		n.rep.mu.RLock()
		same := n.rep.f.Lease(fid).AcquiredTick == n.rep.f.Lease(id).AcquiredTick
		n.rep.mu.RUnlock()
		if same {
			break
		}
	}
	d.target.Store(&id)
	d.hold.Store(false)
	waitFor(t, 30*time.Second, func() bool {
		n.rep.mu.RLock()
		defer n.rep.mu.RUnlock()
		return n.rep.f.Due(n.rep.f.Lease(id))
	})
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	if l := n.rep.f.Lease(id); l.State != fsm.StateActive {
		t.Fatalf("lease %s is %s, want active and due", id, l.State)
	}
	return id
}

// TestDueLeaseReadsAsExpired: a lease past its end whose expiry has not
// applied yet (chunked expiry) reads as expired everywhere, as validate
// says: GET, listings by state (it is no longer in state=active, and is in
// state=expired), and an idempotent replay of its acquire, which answers
// the lease as it answers an ended one (200, state expired), never as a
// live grant.
func TestDueLeaseReadsAsExpired(t *testing.T) {
	d := newDueSetup(t)
	n := d.n
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "due/1", Holder: "h", TTLMS: 100, IdempotencyKey: "due-1"}
	var granted *wire.Lease
	id := d.makeDue(t, req.TTLMS, func() string {
		l, _, err := n.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		granted = l
		return l.LeaseID
	})
	req.IdempotencyKey = "due-1"

	v, err := n.Validate(ctx, wire.ValidateRequest{LeaseID: id, Token: granted.Token})
	if err != nil || v.Valid || v.Reason != "expired" {
		t.Fatalf("validate: %+v %v", v, err)
	}
	if v.Current == nil || v.Current.State != "expired" {
		t.Errorf("validate's current: %+v", v.Current)
	}
	l, err := n.GetLease(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != "expired" || l.RemainingMS != 0 {
		t.Errorf("GET of a due lease: state %s remaining %d, want expired 0", l.State, l.RemainingMS)
	}
	for _, q := range []wire.ListRequest{{State: "active"}, {State: "active", Key: "due/1"}, {State: "active", Holder: "h"}, {State: "active", Prefix: "due/"}} {
		ls, err := n.ListLeases(ctx, q, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ls.Leases {
			if x.LeaseID == id {
				t.Errorf("listing %+v has the due lease %s as %s", q, id, x.State)
			}
		}
	}
	for _, q := range []wire.ListRequest{{State: "expired"}, {Prefix: "due/"}, {State: "expired", Holder: "h"}} {
		ls, err := n.ListLeases(ctx, q, false)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, x := range ls.Leases {
			if x.LeaseID == id {
				found = true
				if x.State != "expired" || x.RemainingMS != 0 {
					t.Errorf("listing %+v: the due lease is %s with %d ms left", q, x.State, x.RemainingMS)
				}
			}
		}
		if !found {
			t.Errorf("listing %+v lacks the due lease", q)
		}
	}
	r, replayed, err := n.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !replayed || r.LeaseID != id || r.State != "expired" || r.RemainingMS != 0 {
		t.Errorf("replay of a due lease's acquire: replayed %v, %s %s with %d ms left; want the lease, expired", replayed, r.LeaseID, r.State, r.RemainingMS)
	}
	// Still due: nothing above ended it, and its key stays held.
	n.rep.mu.RLock()
	due := n.rep.f.Due(n.rep.f.Lease(id))
	n.rep.mu.RUnlock()
	if !due {
		t.Fatal("the lease is no longer due; the checks above did not see a due lease")
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "due/1", Holder: "other", TTLMS: 1000}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire on the due lease's key: %v, want LEASE_HELD", err)
	}
	// Once the clock runs again, the lease ends as expired.
	d.target.Store(nil)
	waitFor(t, 30*time.Second, func() bool {
		l, err := n.GetLease(ctx, id, true)
		return err == nil && l.State == "expired" && l.EndedAt != nil
	})
}

// TestControlOwnerNotLockedOutByItsDueLease: a reconnecting owner whose
// control lease is due (past its end, its expiry waiting for its chunk)
// gets a new lease; its own due lease does not answer it CONTROL_LOCKED.
// Another connection is still locked out while the due lease holds the key.
func TestControlOwnerNotLockedOutByItsDueLease(t *testing.T) {
	d := newDueSetup(t)
	n := d.n
	ctx := context.Background()
	var first *ControlState
	id := d.makeDue(t, 1000, func() string {
		st, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", ClientName: "K1", TTLMS: 1000, HeartbeatIntervalMS: 300})
		if err != nil {
			t.Fatal(err)
		}
		first = st
		return st.LeaseID
	})
	if _, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_b", ClientName: "other"}); wire.ErrorCode(err) != wire.CodeControlLocked {
		t.Fatalf("another connection while the owner's lease is due: %v, want CONTROL_LOCKED", err)
	}
	st, err := n.ControlAcquire(ctx, ControlAcquireRequest{Holder: "ws_a", ClientName: "K1", TTLMS: 1000, HeartbeatIntervalMS: 300,
		LeaseID: id, Token: first.LeaseToken})
	if err != nil {
		t.Fatalf("the owner's re-acquire with its due lease: %v", err)
	}
	if !st.Active || st.LeaseID == id || st.LeaseToken == "" || st.Owner != "ws_a" {
		t.Fatalf("re-acquired: %+v", st)
	}
	n.rep.mu.RLock()
	old := n.rep.f.Lease(id)
	n.rep.mu.RUnlock()
	if old.State == fsm.StateActive {
		t.Fatalf("the due lease %s is still active", id)
	}
	cur, err := n.ControlStatus(ctx, false)
	if err != nil || !cur.Active || cur.LeaseID != st.LeaseID {
		t.Fatalf("status after the re-acquire: %+v %v", cur, err)
	}
}
