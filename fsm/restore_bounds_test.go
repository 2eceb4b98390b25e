package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// boundsState is a running state with a backup taken in it: the backup
// has alice's leases A and B and her session S1; after it, A and B are
// released and bob holds C and session S2. Restoring the backup gives
// three active leases (A, B back; C kept), alice two, and two sessions.
func boundsState(t *testing.T) (*harness, []byte) {
	t.Helper()
	h := newHarness(t)
	h.tick(1)
	h.one(acq("A", "k1", "alice", 1000))
	h.one(acq("B", "k2", "alice", 1000))
	h.one(session("S1", "alice", 1000))
	backup := snapshotBytes(t, h.f)
	h.one(release("A"))
	h.one(release("B"))
	h.one(acq("C", "k3", "bob", 1000))
	h.one(session("S2", "bob", 1000))
	return h, backup
}

// TestRestoreQuota: a restore whose result would exceed a count limit the
// commit carries (live leases, sessions, a holder's leases or sessions)
// is refused with RESOURCE_EXHAUSTED naming the limit, and the running
// state is unchanged, on every replica alike; at the limit, it applies.
// (Before the commit carried the limits, every restore applied.)
func TestRestoreQuota(t *testing.T) {
	cases := []struct {
		name  string
		q     fsm.Quota
		field string // "" when the restore applies
	}{
		{"leases", fsm.Quota{Leases: 2}, "leases"},
		{"sessions", fsm.Quota{Sessions: 1}, "sessions"},
		{"holder leases", fsm.Quota{HolderLeases: 1}, "leases_per_holder"},
		{"holder sessions", fsm.Quota{Leases: 10, HolderSessions: 1, Sessions: 10}, ""},
		{"at the limits", fsm.Quota{Leases: 3, Sessions: 2, HolderLeases: 2, HolderSessions: 1}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, backup := boundsState(t)
			cmds := rechunk(t, "r1", backup, 1+len(backup)/3)
			commit := cmds[len(cmds)-1].(*fsm.RestoreCommit)
			commit.Quota = tc.q
			// A twin replica that starts from a snapshot between the
			// chunks must decide the same.
			for _, c := range cmds[:1] {
				h.one(c)
			}
			twin := &harness{t: t, f: fsm.New(), index: h.index}
			if err := twin.f.Restore(bytes.NewReader(snapshotBytes(t, h.f))); err != nil {
				t.Fatal(err)
			}
			before := jsonOf(t, leasesOf(h.f))
			var r fsm.Result
			for _, c := range cmds[1:] {
				r = h.one(c)
				if r2 := twin.one(c); jsonOf(t, r2) != jsonOf(t, r) {
					t.Fatalf("replicas disagree: %s vs %s", jsonOf(t, r), jsonOf(t, r2))
				}
			}
			if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, twin.f)) {
				t.Fatal("replicas differ after the commit")
			}
			if tc.field == "" {
				if r.Err != nil || r.Restore == nil {
					t.Fatalf("a restore within the limits: %+v", r)
				}
				if l := h.f.Lease("A"); l.State != fsm.StateActive {
					t.Fatalf("lease A did not come back: %+v", l)
				}
				return
			}
			wantCode(t, "restore over a limit", r.Err, wire.CodeResourceExhausted)
			if r.Err.Field != tc.field || r.Restore != nil {
				t.Fatalf("refusal: field %q (want %q), %+v", r.Err.Field, tc.field, r)
			}
			t.Log(r.Err.Message)
			if after := jsonOf(t, leasesOf(h.f)); after != before {
				t.Fatalf("a refused restore changed the leases:\n%s\n%s", before, after)
			}
			if id, _, _ := h.f.Staged(); id != "" {
				t.Fatal("the staging was kept after a refused commit")
			}
			if n, s := h.f.Counts(); n != 1 || s != 2 {
				t.Fatalf("after a refused restore: %d leases, %d sessions; want 1, 2", n, s)
			}
		})
	}
}

// TestRestoreQuotaPerHolderSessions: a holder over its session limit only
// through the restore is refused, and the first such holder by name is
// the one named.
func TestRestoreQuotaPerHolderSessions(t *testing.T) {
	h, backup := boundsState(t)
	h.one(session("S3", "alice", 1000))
	h.one(session("S4", "aaron", 1000))
	h.one(session("S5", "aaron", 1000))
	cmds := rechunk(t, "r1", backup, len(backup))
	cmds[len(cmds)-1].(*fsm.RestoreCommit).Quota = fsm.Quota{HolderSessions: 1}
	var r fsm.Result
	for _, c := range cmds {
		r = h.one(c)
	}
	wantCode(t, "restore over the per-holder session limit", r.Err, wire.CodeResourceExhausted)
	if r.Err.Field != "sessions_per_holder" || !bytes.Contains([]byte(r.Err.Message), []byte(`"aaron"`)) {
		t.Fatalf("refusal: %+v", r.Err)
	}
}

// TestPreviewRestore: the leader's preview decides what the apply decides.
func TestPreviewRestore(t *testing.T) {
	for _, q := range []fsm.Quota{{Leases: 2}, {Leases: 3}, {HolderLeases: 1}, {Sessions: 1}, {}} {
		h, backup := boundsState(t)
		nf := fsm.New()
		if err := nf.Restore(bytes.NewReader(backup)); err != nil {
			t.Fatal(err)
		}
		st, perr := nf.PreviewRestore(h.f, q, 0)
		cmds := rechunk(t, "r1", backup, len(backup))
		cmds[len(cmds)-1].(*fsm.RestoreCommit).Quota = q
		var r fsm.Result
		for _, c := range cmds {
			r = h.one(c)
		}
		if (perr == nil) != (r.Err == nil) || perr != nil && perr.Field != r.Err.Field {
			t.Fatalf("quota %+v: preview %v, apply %v", q, perr, r.Err)
		}
		if r.Restore != nil && (st.Refenced != r.Restore.Refenced || st.Kept != r.Restore.Kept) {
			t.Fatalf("quota %+v: preview %+v, apply %+v", q, st, *r.Restore)
		}
	}
}

// TestRestoreFenceFloor: with a fence floor, every lease the restore
// brings back, and every lease granted after it, has a token above the
// floor (the last token of the cluster the file came from); without one,
// the tokens continue from the higher of the file's and the running
// state's counter, and can repeat a token the file's cluster issued after
// the save.
func TestRestoreFenceFloor(t *testing.T) {
	// The old cluster: A (token 1) and B (token 2) at the save; it then
	// grants 50 more leases (tokens up to 52) before it is lost.
	old := newHarness(t)
	old.tick(1)
	old.one(acq("A", "k1", "alice", 1000))
	old.one(acq("B", "k2", "alice", 1000))
	backup := snapshotBytes(t, old.f)
	for i := range 50 {
		old.one(acq("X"+itoa(i), "x"+itoa(i), "carol", 1000))
	}
	oldLast := old.f.Fence()

	for _, floor := range []uint64{0, oldLast} {
		// A new cluster, into which the backup is restored.
		h := newHarness(t)
		h.tick(1)
		h.one(acq("N", "n", "dave", 1000))
		nFence := h.f.Lease("N").Fence
		cmds := rechunk(t, "r1", backup, len(backup))
		cmds[len(cmds)-1].(*fsm.RestoreCommit).FenceFloor = floor
		var r fsm.Result
		for _, c := range cmds {
			r = h.one(c)
		}
		if r.Err != nil || r.Restore == nil || r.Restore.Refenced != 2 {
			t.Fatalf("floor %d: %+v", floor, r)
		}
		h.one(acq("D", "k9", "erin", 1000))
		lowest := min(h.f.Lease("A").Fence, h.f.Lease("B").Fence, h.f.Lease("D").Fence)
		if floor == 0 {
			if lowest > oldLast {
				t.Fatalf("without a floor the tokens (from %d) are already above the old cluster's last %d: the case is not exercised", lowest, oldLast)
			}
			continue
		}
		if lowest <= floor {
			t.Fatalf("a token %d at or below the fence floor %d after the restore", lowest, floor)
		}
		if f := h.f.Lease("N").Fence; f != nFence {
			t.Fatalf("the running state's lease changed its token: %d", f)
		}
	}
}

func itoa(i int) string { return string(rune('a'+i/26)) + string(rune('a'+i%26)) }

// leasesOf renders every lease record of f.
func leasesOf(f *fsm.FSM) []fsm.Lease {
	var out []fsm.Lease
	for _, id := range []string{"A", "B", "C"} {
		if l := f.Lease(id); l != nil {
			out = append(out, *l)
		}
	}
	return out
}

// TestRestoreCommitBoundedEncoding: a commit with bounds travels as its own
// type and round-trips; one without is the plain type; a bounded entry
// that carries no bound does not decode (one encoding per command), and
// neither does one in a batch.
func TestRestoreCommitBoundedEncoding(t *testing.T) {
	c := &fsm.RestoreCommit{ID: "r1", Chunks: 2, Size: 10, Quota: fsm.Quota{Leases: 5, HolderSessions: 2}, FenceFloor: 7}
	b, err := fsm.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	if fsm.Type(b[1]) != fsm.TypeRestoreCommitBounded {
		t.Fatalf("type %d", b[1])
	}
	d, err := fsm.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if jsonOf(t, d) != jsonOf(t, c) {
		t.Fatalf("round trip: %s vs %s", jsonOf(t, d), jsonOf(t, c))
	}
	plain, err := fsm.Encode(&fsm.RestoreCommit{ID: "r1", Chunks: 2, Size: 10})
	if err != nil || fsm.Type(plain[1]) != fsm.TypeRestoreCommit {
		t.Fatalf("plain commit: %v %v", plain, err)
	}
	empty := bytes.Clone(plain)
	empty[1] = byte(fsm.TypeRestoreCommitBounded)
	empty = append(empty, 0, 0, 0, 0, 0, 0, 0)
	if _, err := fsm.Decode(empty); err == nil {
		t.Fatal("a bounded commit without bounds decoded")
	}
	if _, err := fsm.Encode(&fsm.Batch{Commands: []fsm.Command{c}}); err == nil {
		t.Fatal("a bounded restore commit was encoded in a batch")
	}
}

// TestRestoreCommitSkip: a commit the applying server marks Skip (the
// operator's --skip-restore) changes nothing and drops the staging; a
// replica that skips it and one that never saw the restore are identical.
func TestRestoreCommitSkip(t *testing.T) {
	h, backup := boundsState(t)
	plain := &harness{t: t, f: fsm.New(), index: h.index}
	if err := plain.f.Restore(bytes.NewReader(snapshotBytes(t, h.f))); err != nil {
		t.Fatal(err)
	}
	cmds := rechunk(t, "r1", backup, len(backup))
	for _, c := range cmds[:len(cmds)-1] {
		h.one(c)
		plain.one(&fsm.Tick{Tick: plain.f.Tick(), WallMS: 1, PeriodMS: periodMS}) // a duplicate tick: nothing
	}
	commit := *cmds[len(cmds)-1].(*fsm.RestoreCommit)
	h.index++
	res := h.f.Apply(h.index, &fsm.RestoreCommit{ID: commit.ID, Chunks: commit.Chunks, Size: commit.Size, SHA256: commit.SHA256, Skip: true})
	plain.one(&fsm.Tick{Tick: plain.f.Tick(), WallMS: 1, PeriodMS: periodMS})
	if len(res) != 1 || res[0].Err == nil || res[0].Restore != nil || !bytes.Contains([]byte(res[0].Err.Message), []byte("skipped")) {
		t.Fatalf("a skipped commit: %+v", res)
	}
	if id, _, _ := h.f.Staged(); id != "" {
		t.Fatal("the staging was kept after a skipped commit")
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, plain.f)) {
		t.Fatal("a replica that skipped the restore differs from one that never saw it")
	}
}

// TestPreviewRestoreLeavesStateAlone: the leader's dry run only reads the
// running state, also when it has an expiry backlog: leases still active
// on a session that has ended (left due by a limited tick) are ended in
// the result, never in the running state's shared records.
func TestPreviewRestoreLeavesStateAlone(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("A", "k0", "alice", 1000))
	backup := snapshotBytes(t, h.f)
	h.one(session("S", "s", 3))
	for _, id := range []string{"L1", "L2", "L3"} {
		h.one(bound(id, "k"+id, "S"))
	}
	for range 20 {
		if s := h.f.Session("S"); s.State != fsm.SessionActive {
			break
		}
		next := h.f.Tick() + 1
		h.one(&fsm.Tick{Tick: next, WallMS: int64(next) * periodMS, PeriodMS: periodMS, ExpireMax: 1})
	}
	if s := h.f.Session("S"); s.State == fsm.SessionActive || h.f.Backlog() == 0 {
		t.Fatalf("setup: session %s with backlog %d; want it ended with leases left due", s.State, h.f.Backlog())
	}
	before := snapshotBytes(t, h.f)
	nf := fsm.New()
	if err := nf.Restore(bytes.NewReader(backup)); err != nil {
		t.Fatal(err)
	}
	if _, err := nf.PreviewRestore(h.f, fsm.Quota{}, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, snapshotBytes(t, h.f)) {
		t.Fatal("the dry run changed the running state")
	}
}
