package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestRebase: a state restored from an old snapshot continues above
// everything the running state did: its index, its fencing counter (which
// batches push ahead of the index), its member registry; queued acquires
// of the old state are withdrawn.
func TestRebase(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("L1", "k", "a", 100))
	h.one(withWait(acq("W1", "k", "b", 100), 50)) // queued behind L1
	old := snapshotBytes(t, h.f)

	// The running state goes on: one entry grants many leases, so the
	// fencing counter runs ahead of the log index.
	batch := &fsm.Batch{}
	for i := range 50 {
		batch.Commands = append(batch.Commands, acq(fmt.Sprint("B", i), fmt.Sprint("b/", i), "c", 100))
	}
	h.apply(batch)
	h.one(&fsm.Member{ID: "n2", Incarnation: "x"})
	if h.f.Fence() <= h.index {
		t.Fatalf("fence %d not ahead of index %d", h.f.Fence(), h.index)
	}

	r := fsm.New()
	if err := r.Restore(bytes.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	at := h.index + 1
	if n := r.Rebase(h.f, at); n != 1 {
		t.Fatalf("withdrew %d queued acquires, want 1", n)
	}
	if r.Index() != at || r.Fence() != h.f.Fence() {
		t.Fatalf("index %d fence %d, want %d and %d", r.Index(), r.Fence(), at, h.f.Fence())
	}
	if _, ok := r.Member("n2"); !ok {
		t.Fatal("member registry is not the running one")
	}
	// Its encoding round-trips, and the next grant is above every token.
	var buf bytes.Buffer
	if _, err := r.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t)
	if err := h2.f.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	h2.index = h2.f.Index() + 1 // Raft's restore burns one index
	res := h2.one(release("L1"))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(h2.notices) != 0 || h2.f.Lease("W1") != nil {
		t.Fatalf("the withdrawn acquire was granted: %+v", h2.notices)
	}
	res = h2.one(acq("N1", "k", "d", 100))
	if res.Err != nil || res.Lease.Fence <= h.f.Fence() {
		t.Fatalf("grant after rebase: %v fence %d, before %d", res.Err, res.Lease.Fence, h.f.Fence())
	}
}

// restoreInto restores snap into the running state of h the way a node
// does: through the log, as RestoreChunk entries and a RestoreCommit, each
// encoded and decoded. A second state machine that starts from h's state
// as a snapshot and applies the same entries ends with the same bytes, and
// the restored state round-trips through a snapshot.
func restoreInto(t *testing.T, h *harness, snap []byte) fsm.RebaseStats {
	t.Helper()
	twin := &harness{t: t, f: fsm.New(), index: h.index}
	if err := twin.f.Restore(bytes.NewReader(snapshotBytes(t, h.f))); err != nil {
		t.Fatal(err)
	}
	var st fsm.RebaseStats
	for i, c := range restoreCommands("r-"+fmt.Sprint(h.index), snap) {
		res := h.one(c)
		if tw := twin.one(c); (res.Err == nil) != (tw.Err == nil) {
			t.Fatalf("entry %d: %v on one replica, %v on the other", i, res.Err, tw.Err)
		}
		if res.Err != nil {
			t.Fatalf("restore entry %d (%T): %v", i, c, res.Err)
		}
		if res.Restore != nil {
			st = *res.Restore
		}
	}
	installed := snapshotBytes(t, h.f)
	if !bytes.Equal(snapshotBytes(t, twin.f), installed) {
		t.Fatal("two replicas applying the same restore differ")
	}
	n := fsm.New()
	if err := n.Restore(bytes.NewReader(installed)); err != nil {
		t.Fatal(err)
	}
	if again := snapshotBytes(t, n); !bytes.Equal(again, installed) {
		t.Fatal("the rebased state does not round-trip")
	}
	h.f = n
	return st
}

// restoreCommands is what a node proposes to restore body: its chunks,
// then the commit.
func restoreCommands(id string, body []byte) []fsm.Command {
	var out []fsm.Command
	var seq uint64
	for rest := body; len(rest) > 0; seq++ {
		n := min(len(rest), fsm.MaxRestoreChunk)
		out = append(out, &fsm.RestoreChunk{ID: id, Seq: seq, Data: rest[:n], CRC: fsm.ChunkCRC(rest[:n])})
		rest = rest[n:]
	}
	return append(out, &fsm.RestoreCommit{ID: id, Chunks: seq, Size: uint64(len(body)), SHA256: sha256.Sum256(body)})
}

// TestRestoreNeverGoesBack is the case: A holds k (fA), a snapshot
// is saved, A releases, B acquires k (fB > fA), the snapshot is restored.
// B keeps k with fB; A does not come back, so a third client cannot take k
// while B believes it holds it, and fA is not valid.
func TestRestoreNeverGoesBack(t *testing.T) {
	h := newHarness(t)
	h.tick(2)
	fA := h.one(acq("A", "k", "alice", 30)).Lease.Fence
	snap := snapshotBytes(t, h.f)
	h.tick(5)
	if r := h.one(release("A")); r.Err != nil {
		t.Fatal(r.Err)
	}
	b := h.one(acq("B", "k", "bob", 30)).Lease
	if b.Fence <= fA {
		t.Fatalf("fB %d <= fA %d", b.Fence, fA)
	}
	tickBefore, fenceBefore := h.f.Tick(), h.f.Fence()

	st := restoreInto(t, h, snap)
	if st.Superseded != 1 || st.Kept != 1 || st.Refenced != 0 {
		t.Fatalf("stats %+v", st)
	}
	if h.f.Tick() != tickBefore {
		t.Fatalf("tick %d after the restore, %d before", h.f.Tick(), tickBefore)
	}
	act := h.f.ActiveOnKey("k")
	if len(act) != 1 || act[0].ID != "B" || act[0].Fence != b.Fence || act[0].ExpiresTick != b.ExpiresTick {
		t.Fatalf("active on k after the restore: %+v", act)
	}
	if a := h.f.Lease("A"); a == nil || a.State != fsm.StateRevoked || a.EndReason() != fsm.ReasonRestore {
		t.Fatalf("A after the restore: %+v", a)
	}
	if r := h.one(acq("C", "k", "carol", 30)); code(r.Err) != wire.CodeLeaseHeld {
		t.Fatalf("third client: %v, want LEASE_HELD", r.Err)
	}
	if r := h.one(renew("B")); r.Err != nil || r.Lease.Fence != b.Fence {
		t.Fatalf("B renews: %+v", r)
	}
	if r := h.one(renew("A")); code(r.Err) != wire.CodeLeaseRevoked {
		t.Fatalf("A renews: %v, want LEASE_REVOKED", r.Err)
	}
	if r := h.one(release("B")); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(acq("D", "k", "dave", 30)); r.Err != nil || r.Lease.Fence <= fenceBefore {
		t.Fatalf("grant after the restore: %+v (fence before %d)", r, fenceBefore)
	}
}

// TestRestoreKeepsEndedLeases: a lease granted after the save that ended
// before the restore stays ended (its holder's renew is told so, not that
// the lease does not exist).
func TestRestoreKeepsEndedLeases(t *testing.T) {
	h := newHarness(t)
	h.tick(2)
	snap := snapshotBytes(t, h.f)
	h.one(acq("B", "k", "bob", 3))
	h.one(acq("C", "k2", "carol", 30))
	h.one(release("C"))
	h.tickTo(3 + 2 + fsm.GraceTicks)
	if l := h.f.Lease("B"); l.State != fsm.StateExpired {
		t.Fatalf("B: %+v", l)
	}
	fenceBefore := h.f.Fence()
	restoreInto(t, h, snap)
	if r := h.one(renew("B")); code(r.Err) != wire.CodeLeaseExpired {
		t.Fatalf("renew of a lease expired before the restore: %v", r.Err)
	}
	if r := h.one(renew("C")); code(r.Err) != wire.CodeLeaseReleased {
		t.Fatalf("renew of a lease released before the restore: %v", r.Err)
	}
	if r := h.one(acq("D", "k", "dave", 30)); r.Err != nil || r.Lease.Fence <= fenceBefore {
		t.Fatalf("grant after the restore: %+v (fence before %d)", r, fenceBefore)
	}
}

// TestRestoreRefencesWhatComesBack: a lease of the file whose key is free
// before the restore is active again, with a token above every token
// issued before the restore, and the remaining time it had at the save; the
// clock does not go back.
func TestRestoreRefencesWhatComesBack(t *testing.T) {
	h := newHarness(t)
	h.tick(2)
	a := h.one(acq("A", "k", "alice", 30)).Lease
	h.one(acq("A2", "k2", "alice", 30))
	snap := snapshotBytes(t, h.f)
	remaining := a.ExpiresTick - h.f.Tick()
	h.tick(4)
	h.one(release("A"))
	h.one(release("A2"))
	h.one(acq("B", "k", "bob", 30))
	h.one(release("B"))
	batch := &fsm.Batch{}
	for i := range 20 {
		batch.Commands = append(batch.Commands, acq(fmt.Sprint("X", i), fmt.Sprint("x/", i), "x", 30))
	}
	h.apply(batch)
	tickBefore, fenceBefore := h.f.Tick(), h.f.Fence()

	st := restoreInto(t, h, snap)
	if st.Refenced != 2 || st.TickShift != 4 {
		t.Fatalf("stats %+v", st)
	}
	ra, ra2 := h.f.Lease("A"), h.f.Lease("A2")
	if ra.State != fsm.StateActive || ra.Fence <= fenceBefore || ra2.Fence <= ra.Fence || h.f.Fence() < ra2.Fence {
		t.Fatalf("A fence %d, A2 fence %d, counter %d; before the restore %d", ra.Fence, ra2.Fence, h.f.Fence(), fenceBefore)
	}
	if h.f.Tick() != tickBefore || ra.ExpiresTick-h.f.Tick() != remaining {
		t.Fatalf("tick %d (before %d), A ends at %d: %d ticks left, want %d", h.f.Tick(), tickBefore, ra.ExpiresTick,
			ra.ExpiresTick-h.f.Tick(), remaining)
	}
	// The live leases of the batch are kept.
	if l := h.f.Lease("X3"); l == nil || l.State != fsm.StateActive {
		t.Fatalf("X3 after the restore: %+v", l)
	}
	// A's old token is not valid on k: only the new one is.
	for _, l := range h.f.ActiveOnKey("k") {
		if l.Fence == a.Fence {
			t.Fatal("the token issued before the restore is valid again")
		}
	}
	if r := h.one(acq("C", "k", "carol", 30)); code(r.Err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire of a restored key: %v", r.Err)
	}
	h.tickTo(ra.ExpiresTick + fsm.GraceTicks)
	if r := h.one(acq("C", "k", "carol", 30)); r.Err != nil || r.Lease.Fence <= h.f.Lease("A2").Fence {
		t.Fatalf("acquire after the restored lease expired: %+v", r)
	}
}

// TestRestoreKeepsLockDelay: a key blocked by a lock-delay before the
// restore stays blocked until that delay ends, whatever the file says.
func TestRestoreKeepsLockDelay(t *testing.T) {
	h := newHarness(t)
	h.tick(2)
	snap := snapshotBytes(t, h.f) // k free in the file
	h.one(withDelay(acq("B", "k", "bob", 30), 5))
	h.one(&fsm.Revoke{LeaseID: "B"})
	until := h.f.KeyLockDelay("k")
	if until == 0 {
		t.Fatal("no lock-delay")
	}
	restoreInto(t, h, snap)
	if got := h.f.KeyLockDelay("k"); got != until {
		t.Fatalf("lock-delay until %d after the restore, %d before", got, until)
	}
	h.tickTo(until - 1)
	if r := h.one(acq("C", "k", "carol", 30)); code(r.Err) != wire.CodeLockDelay {
		t.Fatalf("acquire in the lock-delay: %v", r.Err)
	}
	h.tick(1)
	if r := h.one(acq("C", "k", "carol", 30)); r.Err != nil {
		t.Fatal(r.Err)
	}
}

// TestRestoreSessions: a session live before the restore is kept with its
// leases; a lease of the file bound to it is not brought back; a session of
// the file that ended since comes back with the leases whose keys are free.
func TestRestoreSessions(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(session("S", "sam", 20))
	h.one(bound("S1", "s/1", "S"))
	h.one(session("T", "tom", 20))
	h.one(bound("T1", "t/1", "T"))
	h.one(bound("T2", "t/2", "T"))
	snap := snapshotBytes(t, h.f)
	h.one(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")})
	h.one(&fsm.Release{LeaseID: "T1", TokenHash: tok("T1")})
	h.one(bound("T3", "t/3", "T"))
	h.one(acq("Z", "t/2", "zed", 30)) // fails: T2 holds it
	h.one(release("T2"))
	h.one(acq("Z", "t/2", "zed", 30))

	restoreInto(t, h, snap)
	tt := h.f.Session("T")
	if tt.State != fsm.SessionActive || jsonOf(t, tt.LeaseIDs) != `["T3"]` {
		t.Fatalf("session T after the restore: %+v", tt)
	}
	if l := h.f.Lease("T1"); l.State != fsm.StateRevoked || l.EndReason() != fsm.ReasonRestore {
		t.Fatalf("T1: %+v", l)
	}
	if act := h.f.ActiveOnKey("t/2"); len(act) != 1 || act[0].ID != "Z" {
		t.Fatalf("t/2: %+v", act)
	}
	if s := h.f.Session("S"); s.State != fsm.SessionActive || jsonOf(t, s.LeaseIDs) != `["S1"]` {
		t.Fatalf("session S after the restore: %+v", s)
	}
	if l := h.f.Lease("S1"); l.State != fsm.StateActive || l.Fence <= h.f.Lease("Z").Fence {
		t.Fatalf("S1: %+v", l)
	}
	if r := h.one(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(&fsm.SessionEnd{SessionID: "T", TokenHash: tok("T")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if n, s := h.f.Counts(); n != 1 || s != 0 {
		t.Fatalf("counts %d leases %d sessions after ending both", n, s)
	}
}

// TestRestoreIdempotency: an idempotent acquire replayed after a restore
// finds the live lease of its idempotency key, not an ended one of the file
// that had the same key.
func TestRestoreIdempotency(t *testing.T) {
	h := newHarness(t)
	h.retain = 3
	h.tick(1)
	h.one(withIdem(acq("Z0", "k", "alice", 30), "op", "fp"))
	h.one(release("Z0"))
	snap := snapshotBytes(t, h.f) // Z0 ended, still retained
	h.tick(5)
	if h.f.Lease("Z0") != nil {
		t.Fatal("Z0 not pruned")
	}
	if r := h.one(withIdem(acq("A2", "k", "alice", 30), "op", "fp")); r.Err != nil || r.Replayed {
		t.Fatalf("%+v", r)
	}
	restoreInto(t, h, snap)
	r := h.one(withIdem(acq("A3", "k", "alice", 30), "op", "fp"))
	if r.Err != nil || !r.Replayed || r.Lease.ID != "A2" {
		t.Fatalf("replay after the restore: %v %+v", r.Err, r.Lease)
	}
}
