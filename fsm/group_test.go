package fsm_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// grp builds a standalone lease group of holder on keys (given in
// increasing order), each exclusive; member i's lease id is id.key, the
// group's token tok(id).
func grp(id, holder string, ttl uint64, keys ...string) *fsm.AcquireGroup {
	c := &fsm.AcquireGroup{GroupID: id, Holder: holder, TokenHash: tok(id),
		TTLMS: int64(ttl) * periodMS, TTLTicks: ttl, WallMS: 1}
	for _, k := range keys {
		c.Keys = append(c.Keys, fsm.GroupKey{LeaseID: id + "." + k, Key: k, Limit: 1})
	}
	return c
}

func grpWait(c *fsm.AcquireGroup, n uint64) *fsm.AcquireGroup { c.WaitTicks = n; return c }

// stateBytes is the snapshot of f without its header (which has the log
// index): what a refused command must leave as it was.
func stateBytes(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	recs, err := fsm.SplitSnapshot(snapshotBytes(t, f))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Join(recs[1:], []byte{0xff})
}

func ids(ls []*fsm.Lease) string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID)
	}
	return strings.Join(out, ",")
}

// noticeFor returns the notice of the last entry for id.
func (h *harness) noticeFor(id string) (fsm.Notice, bool) {
	for _, n := range h.notices {
		if n.LeaseID == id {
			return n, true
		}
	}
	return fsm.Notice{}, false
}

// TestGroupAllOrNothing: a group whose keys are all free is granted at
// once, one lease per key with its own fencing token, the group's id and
// token; one busy key refuses the whole group with LEASE_HELD naming that
// key and its holder, and changes nothing.
func TestGroupAllOrNothing(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	if r := h.one(acq("X", "b", "xavier", 10)); r.Err != nil {
		t.Fatal(r.Err)
	}
	before := stateBytes(t, h.f)
	r := h.one(grp("G1", "alice", 10, "a", "b", "c"))
	wantCode(t, "group with b held", r.Err, wire.CodeLeaseHeld)
	if r.Err.Key != "b" || len(r.Err.Holders) != 1 || r.Err.Holders[0].Holder != "xavier" || r.Err.Holders[0].LeaseID != "X" {
		t.Fatalf("refusal names %q %+v, want b held by xavier (X)", r.Err.Key, r.Err.Holders)
	}
	if len(h.events) != 0 || r.Leases != nil || !bytes.Equal(stateBytes(t, h.f), before) {
		t.Fatalf("a refused group changed the state: events %v, result %+v", h.events, r)
	}
	// Two busy keys: the first in key order is named, the count told.
	h.one(acq("Y", "c", "yves", 10))
	r = h.one(grp("G1", "alice", 10, "a", "b", "c"))
	if r.Err == nil || r.Err.Key != "b" || !strings.Contains(r.Err.Message, "2 of the lease group's 3 keys") {
		t.Fatalf("two busy keys: %v", r.Err)
	}
	h.one(release("X"))
	h.one(release("Y"))

	fence := h.f.Fence()
	r = h.one(grp("G1", "alice", 10, "a", "b", "c"))
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if ids(r.Leases) != "G1.a,G1.b,G1.c" {
		t.Fatalf("members %s", ids(r.Leases))
	}
	for i, l := range r.Leases {
		if l.GroupID() != "G1" || l.TokenHash != tok("G1") || l.Holder != "alice" || l.State != fsm.StateActive || l.ExpiresTick != h.f.Tick()+10 {
			t.Fatalf("member %d: %+v (group %q)", i, l, l.GroupID())
		}
		if l.Fence <= fence || i > 0 && l.Fence <= r.Leases[i-1].Fence {
			t.Fatalf("member %d fence %d after %d", i, l.Fence, fence)
		}
		if h.f.ActiveOnKey(l.Key)[0] != l {
			t.Fatalf("member %s not active on %s", l.ID, l.Key)
		}
	}
	if len(h.eventsOf(fsm.EventAcquired)) != 3 || ids(h.f.Group("G1")) != "G1.a,G1.b,G1.c" {
		t.Fatalf("events %v, group %s", h.events, ids(h.f.Group("G1")))
	}
	// A key of the group is now held: a single acquire names the member.
	r = h.one(acq("Z", "b", "zoe", 10))
	if code(r.Err) != wire.CodeLeaseHeld || r.Err.Holders[0].LeaseID != "G1.b" || r.Err.Holders[0].Holder != "alice" {
		t.Fatalf("single on a member's key: %v", r.Err)
	}
}

// TestGroupRefusals: bad groups are refused with INVALID_ARGUMENT (or
// LIMIT_MISMATCH) and change nothing.
func TestGroupRefusals(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(withLimit(acq("S", "sem", "s", 10), 3))
	tooMany := grp("G", "h", 10)
	for i := range fsm.MaxGroupKeys + 1 {
		tooMany.Keys = append(tooMany.Keys, fsm.GroupKey{LeaseID: fmt.Sprint("L", i), Key: fmt.Sprintf("k%03d", i), Limit: 1})
	}
	dupID := grp("G", "h", 10, "a", "b")
	dupID.Keys[1].LeaseID = dupID.Keys[0].LeaseID
	noTTL := grp("G", "h", 10, "a")
	noTTL.TTLTicks = 0
	zeroLimit := grp("G", "h", 10, "a", "b")
	zeroLimit.Keys[1].Limit = 0
	badKey := grp("G", "h", 10, "a")
	badKey.Keys[0].Key = "bad\x01key"
	existing := grp("G", "h", 10, "x", "y")
	existing.Keys[1].LeaseID = "S"
	tests := []struct {
		name  string
		c     *fsm.AcquireGroup
		code  wire.Code
		field string
	}{
		{"no keys", grp("G", "h", 10), wire.CodeInvalidArgument, "keys"},
		{"too many keys", tooMany, wire.CodeInvalidArgument, "keys"},
		{"duplicate key", grp("G", "h", 10, "a", "a"), wire.CodeInvalidArgument, "keys"},
		{"keys out of order", grp("G", "h", 10, "b", "a"), wire.CodeInvalidArgument, "keys"},
		{"duplicate lease id", dupID, wire.CodeInvalidArgument, "lease_id"},
		{"no ttl", noTTL, wire.CodeInvalidArgument, "ttl_ms"},
		{"limit 0", zeroLimit, wire.CodeInvalidArgument, "limit"},
		{"bad key", badKey, wire.CodeInvalidArgument, "key"},
		{"no group id", grp("", "h", 10, "a"), wire.CodeInvalidArgument, "group_id"},
		{"lease id taken", existing, wire.CodeInvalidArgument, "lease_id"},
		{"limit mismatch", grp("G", "h", 10, "a", "sem"), wire.CodeLimitMismatch, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := stateBytes(t, h.f)
			var r fsm.Result
			if len(tt.c.Keys) == 0 || len(tt.c.Keys) > fsm.MaxGroupKeys {
				h.index++ // such a group does not even encode
				r = h.f.Apply(h.index, tt.c)[0]
				h.events = h.f.TakeEvents()
			} else {
				r = h.one(tt.c)
			}
			wantCode(t, tt.name, r.Err, tt.code)
			if r.Err.Field != tt.field {
				t.Fatalf("field %q, want %q (%v)", r.Err.Field, tt.field, r.Err)
			}
			if tt.code == wire.CodeLimitMismatch && r.Err.Key != "sem" {
				t.Fatalf("LIMIT_MISMATCH names key %q", r.Err.Key)
			}
			if len(h.events) != 0 || !bytes.Equal(stateBytes(t, h.f), before) {
				t.Fatal("a refused group changed the state")
			}
		})
	}
}

// TestGroupWhole: members are renewed and released through their group
// only; renewing, releasing, revoking any member, expiring and releasing
// the holder each end or extend every member in one entry.
func TestGroupWhole(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	if r := h.one(grp("G", "alice", 5, "a", "b")); r.Err != nil {
		t.Fatal(r.Err)
	}
	wantCode(t, "renew a member", h.one(&fsm.Renew{LeaseID: "G.a", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeInvalidArgument)
	wantCode(t, "release a member", h.one(&fsm.Release{LeaseID: "G.a", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeInvalidArgument)
	hb := h.one(&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "G.b", TokenHash: tok("G")}}, WallMS: 2})
	wantCode(t, "heartbeat a member", hb.Items[0].Err, wire.CodeInvalidArgument)
	wantCode(t, "renew with a wrong token", h.one(&fsm.RenewGroup{GroupID: "G", TokenHash: badTok, WallMS: 2}).Err, wire.CodeLeaseTokenInvalid)
	wantCode(t, "renew an unknown group", h.one(&fsm.RenewGroup{GroupID: "nope", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeLeaseNotFound)

	h.tick(3)
	r := h.one(&fsm.RenewGroup{GroupID: "G", TokenHash: tok("G"), TTLMS: 8000, TTLTicks: 8, WallMS: 2})
	if r.Err != nil || len(r.Leases) != 2 {
		t.Fatalf("renew: %+v", r)
	}
	for _, l := range r.Leases {
		if l.ExpiresTick != h.f.Tick()+8 || l.RenewalCount != 1 || l.TTLTicks != 8 {
			t.Fatalf("renewed member %+v", l)
		}
	}
	// Expiry ends both members in the same entry, even with a chunk of 1.
	end := r.Leases[0].ExpiresTick + fsm.GraceTicks
	for h.f.Tick() < end-1 {
		h.tick(1)
	}
	next := h.f.Tick() + 1
	h.one(&fsm.Tick{Tick: next, WallMS: int64(next) * periodMS, PeriodMS: periodMS, ExpireMax: 1})
	if got := len(h.eventsOf(fsm.EventExpired)); got != 2 {
		t.Fatalf("the expiring tick ended %d members, want 2: %v", got, h.events)
	}
	for _, l := range h.f.Group("G") {
		if l.State != fsm.StateExpired || l.EndedTick() != next {
			t.Fatalf("member %+v", l)
		}
	}
	wantCode(t, "renew an expired group", h.one(&fsm.RenewGroup{GroupID: "G", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeLeaseExpired)

	// Revoking one member revokes the group, with lock-delay on each key.
	g2 := grp("G2", "bob", 10, "a", "b")
	g2.LockDelayTicks, g2.LockDelayMS = 3, 3000
	h.one(g2)
	r = h.one(&fsm.Revoke{LeaseID: "G2.b", Reason: "op", WallMS: 5})
	if r.Err != nil || r.Lease.ID != "G2.b" || len(r.Leases) != 2 || len(h.eventsOf(fsm.EventRevoked)) != 2 {
		t.Fatalf("revoke: %+v, events %v", r, h.events)
	}
	for _, k := range []string{"a", "b"} {
		if h.f.KeyLockDelay(k) == 0 {
			t.Fatalf("no lock-delay on %s after the revoke", k)
		}
	}
	h.tick(5)

	// Release: every member, with the reason; then nothing more.
	h.one(grp("G3", "carol", 10, "a", "b"))
	wantCode(t, "release with a wrong token", h.one(&fsm.ReleaseGroup{GroupID: "G3", TokenHash: badTok, WallMS: 6}).Err, wire.CodeLeaseTokenInvalid)
	r = h.one(&fsm.ReleaseGroup{GroupID: "G3", TokenHash: tok("G3"), Reason: "done", WallMS: 6})
	if r.Err != nil || len(r.Leases) != 2 || len(h.eventsOf(fsm.EventReleased)) != 2 {
		t.Fatalf("release: %+v", r)
	}
	for _, l := range r.Leases {
		if l.State != fsm.StateReleased || l.EndReason() != "done" {
			t.Fatalf("released member %+v", l)
		}
	}
	wantCode(t, "release again", h.one(&fsm.ReleaseGroup{GroupID: "G3", TokenHash: tok("G3"), WallMS: 6}).Err, wire.CodeLeaseReleased)

	// A holder release ends the group with the rest of the holder's leases.
	h.one(grp("G4", "dan", 10, "a", "b"))
	if r := h.one(&fsm.ReleaseHolder{Holder: "dan", WallMS: 7}); r.Count != 2 {
		t.Fatalf("holder release ended %d", r.Count)
	}
	for _, l := range h.f.Group("G4") {
		if l.State != fsm.StateRevoked {
			t.Fatalf("member after holder release: %+v", l)
		}
	}
	// Members are pruned together, and the group with them.
	h.retain = 2
	h.tick(3)
	if h.f.Group("G4") != nil || h.f.Lease("G4.a") != nil {
		t.Fatalf("group after retention: %v", h.f.Group("G4"))
	}
	wantCode(t, "renew a pruned group", h.one(&fsm.RenewGroup{GroupID: "G4", TokenHash: tok("G4"), WallMS: 2}).Err, wire.CodeLeaseNotFound)
}

// TestGroupSession: a group bound to a session lives as long as it: the
// session's heartbeat keeps it, RenewGroup is refused, the session token
// releases it, and the session's end ends every member.
func TestGroupSession(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(session("S", "worker", 5))
	c := grp("G", "", 0, "dedup", "tuner")
	c.SessionID, c.SessionTokenHash, c.TTLMS = "S", tok("S"), 0
	c.Keys[1].Limit = 4
	r := h.one(c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	for _, l := range r.Leases {
		if l.SessionID != "S" || l.Holder != "worker" {
			t.Fatalf("member %+v", l)
		}
	}
	if s := h.f.Session("S"); len(s.LeaseIDs) != 2 {
		t.Fatalf("session leases %v", s.LeaseIDs)
	}
	wantCode(t, "renew a bound group", h.one(&fsm.RenewGroup{GroupID: "G", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeInvalidArgument)
	r = h.one(&fsm.ReleaseGroup{GroupID: "G", SessionTokenHash: tok("S"), WallMS: 3})
	if r.Err != nil || r.Leases[0].State != fsm.StateReleased || r.Leases[1].State != fsm.StateReleased {
		t.Fatalf("release with the session token: %+v", r)
	}
	c.GroupID, c.Keys[0].LeaseID, c.Keys[1].LeaseID = "G2", "G2.dedup", "G2.tuner"
	h.one(c)
	h.tick(5 + fsm.GraceTicks)
	for _, l := range h.f.Group("G2") {
		if l.State != fsm.StateExpired || l.EndReason() != fsm.ReasonSessionEnded {
			t.Fatalf("member after the session expired: %+v", l)
		}
	}
}

// TestGroupWaitFairness: a waiting group is queued on each of its keys; it
// is granted only when it heads every queue, and a single-key waiter
// queued behind it on a key that frees first waits (the slot is kept for
// the group) until the group has had its turn.
func TestGroupWaitFairness(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("X", "a", "xavier", 100))
	h.one(acq("Y", "b", "yves", 100))
	r := h.one(grpWait(grp("G", "alice", 10, "a", "b"), 50))
	if r.Err != nil || !r.Queued || ids(r.Leases) != "G.a,G.b" || r.Leases[0].GroupID() != "G" || !h.f.GroupQueued("G") {
		t.Fatalf("group not queued: %+v", r)
	}
	if r := h.one(withWait(acq("S", "a", "sam", 10), 50)); !r.Queued {
		t.Fatalf("single behind the group not queued: %+v", r)
	}
	// a frees: the group still waits for b, and keeps a's slot.
	h.one(release("X"))
	if h.f.Lease("S") != nil || len(h.f.ActiveOnKey("a")) != 0 || !h.f.GroupHeldUp("a") || len(h.notices) != 0 {
		t.Fatalf("after a freed: S %+v, active on a %v, notices %v", h.f.Lease("S"), h.f.ActiveOnKey("a"), h.notices)
	}
	r = h.one(acq("T", "a", "tom", 10))
	if code(r.Err) != wire.CodeLeaseHeld || r.Err.Key != "a" || !strings.Contains(r.Err.Message, "queued ahead") {
		t.Fatalf("acquire without wait on a held-up key: %v", r.Err)
	}
	// b frees: the group is granted, in that entry, and S still waits.
	h.one(release("Y"))
	no, ok := h.noticeFor("G")
	if !ok || no.Err != nil || ids(no.Leases) != "G.a,G.b" || h.f.GroupQueued("G") {
		t.Fatalf("group notice %+v (%v), notices %v", no, ok, h.notices)
	}
	if l := h.f.Lease("G.a"); l == nil || l.State != fsm.StateActive || l.GroupID() != "G" {
		t.Fatalf("member G.a %+v", l)
	}
	if h.f.Lease("S") != nil {
		t.Fatal("S granted while the group holds a")
	}
	h.one(&fsm.ReleaseGroup{GroupID: "G", TokenHash: tok("G"), WallMS: 3})
	if no, ok := h.noticeFor("S"); !ok || no.Lease == nil || no.Lease.Key != "a" {
		t.Fatalf("S after the group released: %+v %v", no, ok)
	}
}

// TestGroupWaitNoDeadlock: groups over overlapping keys, queued in some
// order with single-key waiters among them, are all granted in the end:
// arrival order is the same on every queue, so there is no cycle.
func TestGroupWaitNoDeadlock(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	for _, k := range []string{"a", "b", "c"} {
		h.one(acq("H"+k, k, "holder", 100))
	}
	h.one(grpWait(grp("G1", "g1", 100, "a", "b"), 500))
	h.one(grpWait(grp("G2", "g2", 100, "b", "c"), 500))
	h.one(withWait(acq("Sc", "c", "s", 100), 500))
	h.one(grpWait(grp("G3", "g3", 100, "a", "c"), 500))
	h.one(withWait(acq("Sa", "a", "s", 100), 500))
	// Free the keys in an order that would tempt a greedy scheduler: c,
	// then b, then a.
	var order []string
	collect := func() {
		for _, n := range h.notices {
			if n.Err != nil {
				t.Fatalf("%s refused: %v", n.LeaseID, n.Err)
			}
			order = append(order, n.LeaseID)
		}
	}
	for _, k := range []string{"c", "b", "a"} {
		h.one(release("H" + k))
		collect()
	}
	// Each grant is then released at once, handing its keys on.
	for len(order) < 5 {
		progress := false
		for _, id := range slices.Clone(order) {
			if strings.HasPrefix(id, "G") {
				if r := h.one(&fsm.ReleaseGroup{GroupID: id, TokenHash: tok(id), WallMS: 3}); r.Err == nil {
					progress = true
					collect()
				}
			} else if l := h.f.Lease(id); l != nil && l.State == fsm.StateActive {
				h.one(release(id))
				progress = true
				collect()
			}
		}
		if !progress {
			t.Fatalf("stuck after %v; queued: G1 %v G2 %v G3 %v", order, h.f.GroupQueued("G1"), h.f.GroupQueued("G2"), h.f.GroupQueued("G3"))
		}
	}
	// Queues by arrival: a [G1 G3 Sa], b [G1 G2], c [G2 Sc G3]. c and b
	// free first, but G2 waits behind G1 on b, and G1 for a; then each
	// key serves its queue in order.
	if got := strings.Join(order, " "); got != "G1 G2 Sc G3 Sa" {
		t.Fatalf("grant order %q, want G1 G2 Sc G3 Sa (arrival order on every key)", got)
	}
	if h.f.Waiting() != 0 {
		t.Fatalf("%d still waiting", h.f.Waiting())
	}
}

// TestGroupWaitEnds: a waiting group that times out, is cancelled, or
// whose holder is released leaves every queue at once, is told why (the
// timeout names the busy key and its holder), and the keys it held up
// serve the acquires behind it.
func TestGroupWaitEnds(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("Y", "b", "yves", 100))
	h.one(grpWait(grp("G", "alice", 10, "a", "b"), 3))
	h.one(withWait(acq("S", "a", "sam", 10), 50))
	if h.f.Lease("S") != nil {
		t.Fatal("S granted ahead of the group")
	}
	h.tick(3)
	no, ok := h.noticeFor("G")
	if !ok || code(no.Err) != wire.CodeLeaseHeld || no.Err.Key != "b" || len(no.Err.Holders) != 1 || no.Err.Holders[0].Holder != "yves" {
		t.Fatalf("timeout notice %+v %v", no, ok)
	}
	if s, ok := h.noticeFor("S"); !ok || s.Lease == nil {
		t.Fatalf("S not granted once the group left: %+v", h.notices)
	}
	if h.f.GroupQueued("G") || h.f.Lease("G.a") != nil || h.f.Waiting() != 0 {
		t.Fatal("the group is still queued somewhere")
	}

	// Cancel (through any member) withdraws the whole group.
	h.one(grpWait(grp("G2", "alice", 10, "a", "b"), 50))
	h.one(&fsm.CancelWait{LeaseID: "G2.b", Key: "b"})
	if h.f.GroupQueued("G2") || h.f.Waiting() != 0 {
		t.Fatal("cancel left the group queued")
	}

	// A holder release withdraws its queued group, then frees its keys.
	h.one(release("S"))
	h.one(grpWait(grp("G3", "alice", 10, "a", "b"), 50))
	h.one(withWait(acq("T", "a", "tom", 10), 50))
	r := h.one(&fsm.ReleaseHolder{Holder: "alice", WallMS: 5})
	if no, ok := h.noticeFor("G3"); !ok || code(no.Err) != wire.CodeLeaseRevoked || r.Count != 1 {
		t.Fatalf("holder release: count %d, notices %v", r.Count, h.notices)
	}
	if no, ok := h.noticeFor("T"); !ok || no.Lease == nil {
		t.Fatalf("T not granted once the group was withdrawn: %v", h.notices)
	}
}

// TestGroupIdempotent: the same group acquire with the same idempotency
// hash and fingerprint replays the group (granted or queued); another
// fingerprint, or a single acquire under the same hash, conflicts.
func TestGroupIdempotent(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	c := grp("G", "alice", 10, "a", "b")
	c.IdemHash, c.Fingerprint, c.SealedToken = fsm.HashOf("idem"), fsm.HashOf("fp"), []byte("sealed")
	if r := h.one(c); r.Err != nil {
		t.Fatal(r.Err)
	}
	again := grp("G-retry", "alice", 10, "a", "b")
	again.IdemHash, again.Fingerprint = c.IdemHash, c.Fingerprint
	r := h.one(again)
	if r.Err != nil || !r.Replayed || ids(r.Leases) != "G.a,G.b" || string(r.Leases[0].SealedToken()) != "sealed" || len(h.events) != 0 {
		t.Fatalf("replay: %+v", r)
	}
	again.Fingerprint = fsm.HashOf("other")
	wantCode(t, "other request", h.one(again).Err, wire.CodeIdempotencyConflict)
	single := acq("L", "z", "alice", 10)
	single.IdemHash, single.Fingerprint = c.IdemHash, c.Fingerprint
	wantCode(t, "single under a group's key", h.one(single).Err, wire.CodeIdempotencyConflict)

	// Queued, then replayed while it waits.
	h.one(acq("Y", "q2", "yves", 100))
	q := grpWait(grp("Q", "alice", 10, "q1", "q2"), 50)
	q.IdemHash, q.Fingerprint = fsm.HashOf("idem2"), fsm.HashOf("fp2")
	h.one(q)
	qa := grpWait(grp("Q-retry", "alice", 10, "q1", "q2"), 50)
	qa.IdemHash, qa.Fingerprint = q.IdemHash, q.Fingerprint
	r = h.one(qa)
	if r.Err != nil || !r.Queued || !r.Replayed || r.Leases[0].GroupID() != "Q" || h.f.GroupQueued("Q-retry") {
		t.Fatalf("replay of a queued group: %+v", r)
	}
}

// TestGroupQuota: a group counts as many leases (and, queued, as many
// waiters of its holder) as it has keys.
func TestGroupQuota(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("L", "x", "alice", 10))
	c := grp("G", "alice", 10, "a", "b")
	c.Quota = fsm.Quota{HolderLeases: 2}
	r := h.one(c)
	if code(r.Err) != wire.CodeResourceExhausted || r.Err.Field != "leases_per_holder" || h.f.Lease("G.a") != nil {
		t.Fatalf("holder quota: %v", r.Err)
	}
	c.Quota = fsm.Quota{Leases: 3}
	if r := h.one(c); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.one(acq("Y", "q", "yves", 10))
	w := grpWait(grp("W", "bob", 10, "p", "q"), 10)
	w.Quota = fsm.Quota{HolderWaiters: 1}
	if r := h.one(w); code(r.Err) != wire.CodeResourceExhausted || r.Err.Field != "waiters_per_holder" || h.f.Waiting() != 0 {
		t.Fatalf("holder waiters quota: %v", r.Err)
	}
}

// TestGroupSnapshotRoundTrip: granted and queued groups survive a snapshot
// (the member's group, the waiters' group on each key): the restored
// state has the same bytes, answers the same, and goes on identically
// (the queued group is granted in the same entry, with the same fences).
func TestGroupSnapshotRoundTrip(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	noGroups := snapshotBytes(t, h.f)
	h.one(grp("G", "alice", 10, "a", "b"))
	h.one(acq("Y", "d", "yves", 100))
	h.one(grpWait(grp("Q", "bob", 10, "c", "d"), 50))
	h.one(withWait(acq("S", "c", "sam", 10), 50))
	snap := snapshotBytes(t, h.f)
	if bytes.Equal(snap, noGroups) {
		t.Fatal("no change")
	}
	r := newHarness(t)
	if err := r.f.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	r.index = h.index
	if got := snapshotBytes(t, r.f); !bytes.Equal(got, snap) {
		t.Fatal("the restored state's snapshot differs")
	}
	if ids(r.f.Group("G")) != "G.a,G.b" || !r.f.GroupQueued("Q") || !r.f.GroupHeldUp("c") || r.f.Waiting() != 3 {
		t.Fatalf("restored: group %s, queued %v, held up %v, waiting %d", ids(r.f.Group("G")), r.f.GroupQueued("Q"), r.f.GroupHeldUp("c"), r.f.Waiting())
	}
	for _, x := range []*harness{h, r} {
		wantCode(t, "renew a member", x.one(&fsm.Renew{LeaseID: "G.a", TokenHash: tok("G"), WallMS: 2}).Err, wire.CodeInvalidArgument)
		x.one(release("Y"))
		no, ok := x.noticeFor("Q")
		if !ok || ids(no.Leases) != "Q.c,Q.d" {
			t.Fatalf("queued group after the restore: %+v", x.notices)
		}
	}
	if a, b := jsonOf(t, h.f.Group("Q")), jsonOf(t, r.f.Group("Q")); a != b {
		t.Fatalf("replica and restored replica granted differently:\n%s\n%s", a, b)
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, r.f)) {
		t.Fatal("snapshots differ after the same entry")
	}
}

// TestGroupSnapshotRejects: a damaged group section of a snapshot is
// refused.
func TestGroupSnapshotRejects(t *testing.T) {
	l := &fsm.Lease{ID: "L", Key: "k", Holder: "h", Limit: 1, Fence: 2,
		TokenHash: tok("L"), TTLMS: 1000, TTLTicks: 1, ExpiresTick: 2, AcquiredTick: 1}
	fsm.MarkEnded(l, fsm.StateReleased, "", 1, 0)
	rec := fsm.EncodeLeaseRecord(l)
	for name, body := range map[string][]byte{
		"empty group id": append(slices.Clone(rec), 0),
		"long group id":  append(append(slices.Clone(rec), 65), bytes.Repeat([]byte("g"), 65)...),
		"truncated":      append(slices.Clone(rec), 5, 'g'),
	} {
		t.Run(name, func(t *testing.T) {
			snap := fsm.JoinSnapshot([][]byte{fsm.EncodeHeaderRecord(fsm.SnapshotFormat, 3, 1, 0, 0, 1), body})
			if err := fsm.New().Restore(bytes.NewReader(snap)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	key := fsm.EncodeKeyRecord(fsm.SnapKey{Key: "k", Limit: 1})
	snap := fsm.JoinSnapshot([][]byte{fsm.EncodeHeaderRecord(fsm.SnapshotFormat, 3, 1, 1, 0, 0), append(key, 0)})
	if err := fsm.New().Restore(bytes.NewReader(snap)); err == nil {
		t.Fatal("waiter groups of a key without waiters accepted")
	}
}

// groupCommands are valid commands of the lease group types, for the
// codec tests and as seeds of FuzzDecode.
func groupCommands() []fsm.Command {
	c := grpWait(grp("G1", "alice", 10, "a", "b", "ünï"), 7)
	c.Keys[1].Limit = 3
	c.Metadata = map[string]string{"m": "1"}
	c.IdemHash, c.Fingerprint, c.SealedToken = fsm.HashOf("i"), fsm.HashOf("f"), []byte{1, 2}
	c.Quota = fsm.Quota{Leases: 9, KeyWaiters: 2}
	s := grp("G2", "", 0, "dedup", "tuner")
	s.SessionID, s.SessionTokenHash, s.TTLMS = "S1", tok("S1"), 0
	cmds := []fsm.Command{c, s,
		&fsm.RenewGroup{GroupID: "G1", TokenHash: tok("G1"), TTLMS: 5000, TTLTicks: 5, WallMS: 9},
		&fsm.ReleaseGroup{GroupID: "G1", TokenHash: tok("G1"), SessionTokenHash: tok("S1"), Reason: "r", WallMS: 9},
	}
	return append(cmds, &fsm.Batch{Commands: append([]fsm.Command{&fsm.Tick{Tick: 1}}, cmds...)})
}

// TestGroupCodec: the group commands round-trip, and are refused in
// entries of versions before 4 and in JSON (version 1) entries.
func TestGroupCodec(t *testing.T) {
	for _, cmd := range groupCommands() {
		b, err := fsm.Encode(cmd)
		if err != nil {
			t.Fatal(err)
		}
		d, err := fsm.Decode(b)
		if err != nil {
			t.Fatalf("%T: %v", cmd, err)
		}
		if jsonOf(t, d) != jsonOf(t, cmd) {
			t.Fatalf("round trip:\n%s\n%s", jsonOf(t, d), jsonOf(t, cmd))
		}
		if _, ok := cmd.(*fsm.Batch); ok {
			continue
		}
		old := slices.Clone(b)
		old[0] = 3
		if _, err := fsm.Decode(old); err == nil {
			t.Fatalf("%T accepted in a version 3 entry", cmd)
		}
		if _, err := fsm.Decode(append([]byte{1, b[1]}, jsonOf(t, cmd)...)); err == nil {
			t.Fatalf("%T accepted in a JSON entry", cmd)
		}
		if _, err := fsm.Decode(b[:len(b)-1]); err == nil {
			t.Fatalf("%T accepted truncated", cmd)
		}
	}
	if _, err := fsm.Encode(grp("G", "h", 1)); err == nil {
		t.Fatal("a group of no keys encoded")
	}
	b, _ := fsm.Encode(grp("G", "h", 1, "a"))
	b[2+2] = 0 // the key count of a one-byte group id
	if _, err := fsm.Decode(b); err == nil {
		t.Fatal("a group of no keys decoded")
	}
}

// TestGroupRebase: a restored file's lease group comes back whole or not
// at all: when one of its keys is in use before the restore, every member
// of the file's group ends (revoked, reason restore).
func TestGroupRebase(t *testing.T) {
	file := newHarness(t)
	file.tick(1)
	file.one(grp("G", "alice", 100, "a", "b"))
	file.one(grp("K", "kim", 100, "x", "y"))
	cur := newHarness(t)
	cur.tick(2)
	cur.one(acq("B", "b", "bob", 100))
	f := fsm.New()
	if err := f.Restore(bytes.NewReader(snapshotBytes(t, file.f))); err != nil {
		t.Fatal(err)
	}
	st := f.RebaseStats(cur.f, 10)
	for _, l := range f.Group("G") {
		if l.State != fsm.StateRevoked || l.EndReason() != fsm.ReasonRestore {
			t.Fatalf("member of a group with a key in use: %+v", l)
		}
	}
	for _, l := range f.Group("K") {
		if l.State != fsm.StateActive {
			t.Fatalf("member of a free group: %+v", l)
		}
	}
	if st.Superseded != 2 || st.Refenced != 2 || f.Lease("B").State != fsm.StateActive {
		t.Fatalf("stats %+v", st)
	}
}

// TestGroupsGenerated: the random logs the determinism, model, chunked
// expiry and restore tests run reach every way a lease group goes: granted
// at once, refused, queued, granted after a wait, timed out, holding a
// key's free slot, renewed, released, revoked through a member, expired.
func TestGroupsGenerated(t *testing.T) {
	seen := map[string]int{}
	for seed := uint64(1); seed <= 3; seed++ {
		g := newGen(seed, true)
		g.members, g.meta, g.groups = true, true, true
		r := newReplica(t)
		for i := range 1500 {
			c := g.entry()
			b, err := fsm.Encode(c)
			if err != nil {
				t.Fatal(err)
			}
			res := r.apply(uint64(i+1), b)
			g.granted(res, r.notices)
			for j, sub := range flatten(c) {
				switch sub.(type) {
				case *fsm.AcquireGroup:
					switch {
					case res[j].Replayed:
						seen["replayed"]++
					case res[j].Queued:
						seen["queued"]++
					case res[j].Err != nil:
						seen["refused "+string(res[j].Err.Code)]++
					default:
						seen["granted"]++
					}
				case *fsm.RenewGroup:
					if res[j].Err == nil {
						seen["renewed"]++
					}
				case *fsm.ReleaseGroup:
					if res[j].Err == nil {
						seen["released"]++
					}
				case *fsm.Revoke:
					if len(res[j].Leases) > 0 {
						seen["revoked"]++
					}
				}
			}
			for _, n := range r.notices {
				if strings.HasPrefix(n.LeaseID, "G") {
					if n.Err != nil {
						seen["wait ended "+string(n.Err.Code)]++
					} else {
						seen["granted after a wait"]++
					}
				}
			}
			for _, e := range r.events {
				if e.Type == fsm.EventExpired && e.Lease.GroupID() != "" {
					seen["member expired"]++
				}
			}
			for _, k := range genKeys {
				if r.f.GroupHeldUp(k) {
					seen["held up"]++
				}
			}
		}
	}
	t.Logf("%v", seen)
	for _, what := range []string{"granted", "queued", "replayed", "refused LEASE_HELD", "refused LIMIT_MISMATCH",
		"granted after a wait", "wait ended LEASE_HELD", "held up", "renewed", "released", "revoked", "member expired"} {
		if seen[what] < 3 {
			t.Errorf("%q happened %d times", what, seen[what])
		}
	}
}
