package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func withQuota(a *fsm.Acquire, q fsm.Quota) *fsm.Acquire { a.Quota = q; return a }

// refused checks that c is refused with RESOURCE_EXHAUSTED naming field and
// limit, and that the state (its snapshot bytes, the index aside) is what it
// was.
func refused(t *testing.T, h *harness, c fsm.Command, field string, limit uint64) {
	t.Helper()
	before := snapshotBytes(t, h.f)
	leases, sessions := h.f.Counts()
	r := h.one(c)
	wantCode(t, field, r.Err, wire.CodeResourceExhausted)
	if r.Err.Field != field || r.Err.Limit != limit {
		t.Fatalf("%s: error %+v, want field %q limit %d", field, r.Err, field, limit)
	}
	if len(h.events) != 0 {
		t.Fatalf("%s: a refused command emitted %v", field, h.events)
	}
	if l, s := h.f.Counts(); l != leases || s != sessions {
		t.Fatalf("%s: counts %d/%d after a refusal, were %d/%d", field, l, s, leases, sessions)
	}
	// The header record carries the index, which moved; every other
	// record must be what it was.
	b, err1 := fsm.SplitSnapshot(before)
	a, err2 := fsm.SplitSnapshot(snapshotBytes(t, h.f))
	if err1 != nil || err2 != nil || len(a) != len(b) {
		t.Fatalf("%s: snapshots %d and %d records (%v, %v)", field, len(b), len(a), err1, err2)
	}
	for i := 1; i < len(a); i++ {
		if !bytes.Equal(a[i], b[i]) {
			t.Fatalf("%s: a refused command changed record %d of the state", field, i)
		}
	}
}

// TestQuotaLeases: the cluster-wide lease limit counts active leases and
// queued acquires; at the limit an acquire succeeds, over it it is refused
// and changes nothing, and the count drops on release and expiry.
func TestQuotaLeases(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	q := fsm.Quota{Leases: 3}
	if r := h.one(withQuota(acq("A", "k1", "alice", 5), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(acq("B", "k2", "bob", 10), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	// A queued acquire is a live lease too: the third, at the limit.
	if r := h.one(withQuota(withWait(acq("W", "k1", "carol", 5), 20), q)); r.Err != nil || !r.Queued {
		t.Fatalf("queued acquire: %+v", r)
	}
	refused(t, h, withQuota(acq("C", "k3", "carol", 5), q), "leases", 3)
	refused(t, h, withQuota(withWait(acq("C", "k1", "carol", 5), 5), q), "leases", 3)
	// An idempotent replay is not a new lease: answered even at the limit.
	h2 := newHarness(t)
	h2.tick(1)
	if r := h2.one(withQuota(withIdem(acq("I", "k", "alice", 5), "x", "fp"), fsm.Quota{Leases: 1})); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h2.one(withQuota(withIdem(acq("I2", "k", "alice", 5), "x", "fp"), fsm.Quota{Leases: 1})); r.Err != nil || !r.Replayed {
		t.Fatalf("replay at the limit: %+v", r)
	}
	// Releasing A hands its slot to W: two live leases, B and W.
	if r := h.one(release("A")); r.Err != nil {
		t.Fatal(r.Err)
	}
	if l, _ := h.f.Counts(); l != 2 {
		t.Fatalf("active leases %d after release and grant, want 2", l)
	}
	if r := h.one(withQuota(acq("C", "k3", "carol", 5), q)); r.Err != nil {
		t.Fatalf("after a release: %v", r.Err)
	}
	refused(t, h, withQuota(acq("D", "k4", "dave", 5), q), "leases", 3)
	// Expiry: W (granted at tick 1, ttl 5) and C end; B (ttl 10) stays.
	h.tickTo(9)
	if l, _ := h.f.Counts(); l != 1 {
		t.Fatalf("active leases %d after expiry, want 1", l)
	}
	if r := h.one(withQuota(acq("D", "k4", "dave", 5), q)); r.Err != nil {
		t.Fatalf("after expiry: %v", r.Err)
	}
	// No quota: no limit.
	if r := h.one(acq("E", "k5", "erin", 5)); r.Err != nil {
		t.Fatal(r.Err)
	}
}

// TestQuotaHolderLeases: the per-holder limit counts the holder's active
// leases, bound ones included, and only that holder's.
func TestQuotaHolderLeases(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	q := fsm.Quota{HolderLeases: 2}
	if r := h.one(session("S1", "alice", 10)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(acq("A", "k1", "alice", 5), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(bound("B", "k2", "S1"), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	refused(t, h, withQuota(acq("C", "k3", "alice", 5), q), "leases_per_holder", 2)
	refused(t, h, withQuota(bound("C", "k3", "S1"), q), "leases_per_holder", 2)
	if r := h.one(withQuota(acq("C", "k3", "bob", 5), q)); r.Err != nil {
		t.Fatalf("another holder: %v", r.Err)
	}
	if r := h.one(&fsm.Release{LeaseID: "B", SessionTokenHash: tok("S1")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(acq("D", "k3b", "alice", 5), q)); r.Err != nil {
		t.Fatalf("after a release: %v", r.Err)
	}
	// In a batch, each command sees the ones before it.
	res := h.apply(&fsm.Batch{Commands: []fsm.Command{
		withQuota(acq("E", "k4", "erin", 5), q),
		withQuota(acq("F", "k5", "erin", 5), q),
		withQuota(acq("G", "k6", "erin", 5), q),
	}})
	if res[0].Err != nil || res[1].Err != nil || code(res[2].Err) != wire.CodeResourceExhausted {
		t.Fatalf("batch results %v %v %v", res[0].Err, res[1].Err, res[2].Err)
	}
}

// TestQuotaSessions: the cluster-wide and per-holder session limits.
func TestQuotaSessions(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	withQ := func(s *fsm.SessionCreate, q fsm.Quota) *fsm.SessionCreate { s.Quota = q; return s }
	q := fsm.Quota{Sessions: 3, HolderSessions: 2}
	for _, s := range []*fsm.SessionCreate{session("S1", "alice", 5), session("S2", "alice", 20), session("S3", "bob", 20)} {
		if r := h.one(withQ(s, q)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	refused(t, h, withQ(session("S4", "carol", 5), q), "sessions", 3)
	refused(t, h, withQ(session("S4", "alice", 5), fsm.Quota{Sessions: 10, HolderSessions: 2}), "sessions_per_holder", 2)
	if r := h.one(&fsm.SessionEnd{SessionID: "S3", TokenHash: tok("S3")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQ(session("S4", "carol", 5), q)); r.Err != nil {
		t.Fatalf("after an end: %v", r.Err)
	}
	refused(t, h, withQ(session("S5", "alice", 5), q), "sessions", 3)
	// S1 and S4 expire (ttl 5 from tick 1): alice is down to one session.
	h.tickTo(9)
	if _, s := h.f.Counts(); s != 1 {
		t.Fatalf("active sessions %d after expiry, want 1", s)
	}
	if r := h.one(withQ(session("S5", "alice", 5), q)); r.Err != nil {
		t.Fatalf("after expiry: %v", r.Err)
	}
}
