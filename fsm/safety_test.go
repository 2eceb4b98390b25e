package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// These tests pin the safety properties the chaos suite's canaries break
// (build tags canary_early_expiry, canary_fence_reset, canary_renew_token):
// each fails when its canary is compiled in. The numbers are literal on
// purpose, so that a change to a constant cannot move the expectation along
// with the bug.

// TestExpiryNeverEarly: a lease acquired at tick t with a TTL of n ticks is
// active through tick t+n+1 and expires when tick t+n+2 commits, whether or
// not it was renewed, and also on a replica restored from a snapshot.
func TestExpiryNeverEarly(t *testing.T) {
	h := newHarness(t)
	h.tickTo(10)
	if r := h.one(acq("A", "k/a", "w", 5)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(acq("B", "k/b", "w", 5)); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.tickTo(12)
	if r := h.one(renew("B")); r.Err != nil || r.Lease.ExpiresTick != 17 {
		t.Fatalf("renew B at tick 12: %+v", r)
	}
	// A restored replica must agree.
	g := fsm.New()
	if err := g.Restore(bytes.NewReader(snapshotBytes(t, h.f))); err != nil {
		t.Fatal(err)
	}
	r := &harness{t: t, f: g, index: h.index}

	for _, x := range []*harness{h, r} {
		x.tickTo(16) // A: t=10, n=5: active through tick 16
		if l := x.f.Lease("A"); l.State != fsm.StateActive {
			t.Fatalf("lease A %s at tick 16, before its deadline 17", l.State)
		}
		x.tickTo(17)
		if l := x.f.Lease("A"); l.State != fsm.StateExpired || l.EndedTick() != 17 {
			t.Fatalf("lease A at tick 17: %s, ended %d; want expired at 17", l.State, l.EndedTick())
		}
		x.tickTo(18) // B: renewed at t=12, n=5: active through tick 18
		if l := x.f.Lease("B"); l.State != fsm.StateActive {
			t.Fatalf("renewed lease B %s at tick 18, before its deadline 19", l.State)
		}
		x.tickTo(19)
		if l := x.f.Lease("B"); l.State != fsm.StateExpired || l.EndedTick() != 19 {
			t.Fatalf("lease B at tick 19: %s, ended %d; want expired at 19", l.State, l.EndedTick())
		}
	}
}

// TestFenceNeverReusedAfterRelease: one entry that grants several leases
// runs the fencing counter ahead of the log index; releasing one of them
// must not bring the counter back, so the key's next lease gets a token
// above every token issued before.
func TestFenceNeverReusedAfterRelease(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	res := h.apply(&fsm.Batch{Commands: []fsm.Command{
		acq("A", "k/a", "w", 10), acq("B", "k/b", "w", 10), acq("C", "k/c", "w", 10),
	}})
	var highest uint64
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		highest = max(highest, r.Lease.Fence)
	}
	c := res[2].Lease
	if c.Fence != highest || c.Fence <= h.index {
		t.Fatalf("the batch's last grant has token %d at index %d; want it ahead of the index", c.Fence, h.index)
	}
	if r := h.one(release("C")); r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := h.f.Fence(); got < highest {
		t.Fatalf("fencing counter went back from %d to %d on release", highest, got)
	}
	r := h.one(acq("C2", "k/c", "v", 10))
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if r.Lease.Fence <= highest {
		t.Fatalf("lease after release got token %d; tokens issued before went up to %d", r.Lease.Fence, highest)
	}
	// And the same inside one entry: release, then grant the key again.
	res = h.apply(&fsm.Batch{Commands: []fsm.Command{
		acq("D", "k/d", "w", 10), release("D"), acq("D2", "k/d", "v", 10),
	}})
	if res[2].Err != nil || res[2].Lease.Fence <= res[0].Lease.Fence {
		t.Fatalf("re-grant in the same entry: token %+v after %d", res[2], res[0].Lease.Fence)
	}
}

// TestRenewNeedsToken: a renewal (single or bulk) with a wrong or missing
// token is refused and changes nothing.
func TestRenewNeedsToken(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	if r := h.one(acq("A", "k", "w", 5)); r.Err != nil {
		t.Fatal(r.Err)
	}
	before := snapshotBytes(t, h.f)
	h.index++ // the refused entries below still take log indexes
	for _, c := range []fsm.Command{
		&fsm.Renew{LeaseID: "A", TokenHash: badTok, WallMS: 9},
		&fsm.Renew{LeaseID: "A", WallMS: 9},
	} {
		res := h.f.Apply(h.index, roundTrip(t, c))
		wantCode(t, "renew with a wrong token", res[0].Err, wire.CodeLeaseTokenInvalid)
		h.index++
	}
	res := h.f.Apply(h.index, roundTrip(t, &fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "A", TokenHash: badTok}}, WallMS: 9}))
	wantCode(t, "bulk heartbeat with a wrong token", res[0].Items[0].Err, wire.CodeLeaseTokenInvalid)
	if l := h.f.Lease("A"); l.RenewalCount != 0 || l.ExpiresTick != 6 || l.RenewedWallMS != 0 {
		t.Fatalf("refused renewals changed the lease: %+v", l)
	}
	if evs := h.f.TakeEvents(); len(evs) != 0 {
		t.Fatalf("refused renewals emitted %v", evs)
	}
	// The state differs only by the index in its header.
	after := snapshotBytes(t, h.f)
	if len(before) != len(after) {
		t.Fatalf("refused renewals changed the state: %d bytes before, %d after", len(before), len(after))
	}
}
