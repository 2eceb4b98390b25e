package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// TestRestoreProperty: random states (sessions, semaphores, waiters,
// lock-delays, idempotency keys, members, and ticks limited to two records
// so that an expiry backlog is often pending) restore a snapshot of an
// earlier point through the log, at a random point. Three replicas apply
// the same log: one throughout, one restarted from its snapshot taken at a
// random point between the backup and the restore (possibly between two
// restore chunks), one restarted from a snapshot taken just after the
// restore. They must stay byte-identical; the fencing counter never goes
// down; and once time runs on without new writes, every lease and session
// ends (none is left without a way to end).
func TestRestoreProperty(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 10
	}
	backlogged := 0
	for seed := range uint64(rounds) {
		if restoreRound(t, seed) {
			backlogged++
		}
	}
	t.Logf("%d of %d restores committed with an expiry backlog pending", backlogged, rounds)
	if backlogged == 0 {
		t.Fatal("no restore committed while a backlog was pending: the property was not exercised")
	}
}

// restoreRound runs one seed; it reports whether the restore committed
// while the running state had an expiry backlog.
func restoreRound(t *testing.T, seed uint64) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	g := newGen(seed, true)
	g.members, g.meta, g.groups = true, true, true
	g.chunk = 2
	a := newReplica(t)
	var log [][]byte
	step := func(b []byte) {
		log = append(log, b)
		res := a.apply(uint64(len(log)), b)
		g.granted(res, a.notices)
	}
	gen := func(n int) {
		for range n {
			b, err := fsm.Encode(g.entry())
			if err != nil {
				t.Fatal(err)
			}
			step(b)
		}
	}
	gen(50 + rng.IntN(200))
	backup := snapshotBytes(t, a.f)
	gen(20 + rng.IntN(200))
	// Move on until a backlog is pending, if one comes soon.
	for range 50 {
		if a.f.Backlog() > 0 {
			break
		}
		gen(1)
	}
	withBacklog := a.f.Backlog() > 0
	fenceBefore := a.f.Fence()
	// Small chunks, so that a replica can restart between two of them.
	cmds := rechunk(t, fmt.Sprintf("r%d", seed), backup, 1+len(backup)/5)
	restartAt := len(log) + rng.IntN(len(cmds)) // B starts from a snapshot here
	var b *replica
	for i, c := range cmds {
		if len(log) == restartAt {
			b = restartFrom(t, a)
		}
		res := applyAll(t, c, &log, a, b)
		if res.Err != nil {
			t.Fatalf("seed %d: restore entry %d (%T): %v", seed, i, c, res.Err)
		}
		if i == len(cmds)-1 && res.Restore == nil {
			t.Fatalf("seed %d: the commit applied without a restore", seed)
		}
	}
	if b == nil {
		t.Fatalf("seed %d: no restart point", seed)
	}
	if a.f.Fence() < fenceBefore {
		t.Fatalf("seed %d: fencing counter went down: %d -> %d", seed, fenceBefore, a.f.Fence())
	}
	if _, n, _ := a.f.Staged(); n != 0 {
		t.Fatalf("seed %d: %d chunks still staged after the commit", seed, n)
	}
	c := restartFrom(t, a)
	same := func(when string) {
		sa := snapshotBytes(t, a.f)
		for _, r := range []*replica{b, c} {
			if !bytes.Equal(sa, snapshotBytes(t, r.f)) {
				t.Fatalf("seed %d: replicas differ %s", seed, when)
			}
		}
		if a.f.Backlog() > 0 {
			return // what is due is not all ended yet: checkKeys would see it
		}
		if err := checkKeys(a.f, sa); err != nil {
			t.Fatalf("seed %d: %s: %v", seed, when, err)
		}
	}
	same("right after the restore")
	// More writes on the restored state, then time alone: limited ticks
	// and the Expire entries the backlog needs, as a leader proposes them.
	for range 100 + rng.IntN(200) {
		e, err := fsm.Encode(g.entry())
		if err != nil {
			t.Fatal(err)
		}
		applyAllBytes(t, e, &log, a, b, c)
		g.granted(nil, a.notices)
	}
	same("after more writes")
	for range 200 {
		tk := &fsm.Tick{Tick: a.f.Tick() + 1, WallMS: int64(a.f.Tick()+1) * 100, PeriodMS: 100, RetainTicks: genRetain, ExpireMax: 2}
		applyAll(t, tk, &log, a, b, c)
		for a.f.Backlog() > 0 {
			applyAll(t, &fsm.Expire{Tick: a.f.Tick(), WallMS: int64(a.f.Tick()) * 100, Max: 2}, &log, a, b, c)
		}
	}
	same("after time ran on")
	if ls, _ := a.f.Leases(fsm.LeaseFilter{State: fsm.StateActive}); len(ls) > 0 {
		t.Fatalf("seed %d: %d leases still active 200 ticks after the last write, e.g. %+v (session %+v)",
			seed, len(ls), ls[0], a.f.Session(ls[0].SessionID))
	}
	if ss, _ := a.f.Sessions("", "", 0); len(ss) > 0 {
		for _, s := range ss {
			if s.State == fsm.SessionActive {
				t.Fatalf("seed %d: session %s still active 200 ticks after the last write", seed, s.ID)
			}
		}
	}
	return withBacklog
}

// rechunk is restoreCommands with chunks of size bytes.
func rechunk(t *testing.T, id string, body []byte, size int) []fsm.Command {
	t.Helper()
	var out []fsm.Command
	var seq uint64
	for rest := body; len(rest) > 0; seq++ {
		n := min(len(rest), size, fsm.MaxRestoreChunk)
		out = append(out, &fsm.RestoreChunk{ID: id, Seq: seq, Data: rest[:n], CRC: fsm.ChunkCRC(rest[:n])})
		rest = rest[n:]
	}
	return append(out, &fsm.RestoreCommit{ID: id, Chunks: seq, Size: uint64(len(body)), SHA256: sha256.Sum256(body)})
}

// restartFrom is a replica started from a snapshot of r's state.
func restartFrom(t *testing.T, r *replica) *replica {
	t.Helper()
	n := newReplica(t)
	if err := n.f.Restore(bytes.NewReader(snapshotBytes(t, r.f))); err != nil {
		t.Fatal(err)
	}
	return n
}

// applyAll appends c to the log and applies it on every replica given (nil
// ones are skipped), checking that they agree on the outcome; it returns
// the first replica's result.
func applyAll(t *testing.T, c fsm.Command, log *[][]byte, rs ...*replica) fsm.Result {
	t.Helper()
	b, err := fsm.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return applyAllBytes(t, b, log, rs...)
}

func applyAllBytes(t *testing.T, b []byte, log *[][]byte, rs ...*replica) fsm.Result {
	t.Helper()
	*log = append(*log, b)
	index := uint64(len(*log))
	var first []fsm.Result
	var trace string
	for _, r := range rs {
		if r == nil {
			continue
		}
		res := r.apply(index, b)
		if first == nil {
			first, trace = res, r.trace[index]
		} else if r.trace[index] != trace {
			t.Fatalf("entry %d: replicas disagree:\n%s\n---\n%s", index, trace, r.trace[index])
		}
	}
	return first[0]
}

// TestRestoreStaging: chunks out of order, of another restore, or without
// their commit change nothing; a commit that does not match what was staged
// is refused and drops the staging; a stage nobody completes is dropped
// after RestoreStaleMS; a chunk whose checksum does not match does not
// decode.
func TestRestoreStaging(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("A", "k", "alice", 100))
	backup := snapshotBytes(t, h.f)
	h.one(release("A"))
	cmds := rechunk(t, "r1", backup, 1+len(backup)/3)
	if len(cmds) < 4 {
		t.Fatalf("want at least 3 chunks, got %d commands", len(cmds))
	}

	// A gap: the restore can no longer commit.
	h.one(cmds[0])
	if r := h.one(cmds[2]); r.Err == nil {
		t.Fatal("an out-of-order chunk was accepted")
	}
	if id, n, _ := h.f.Staged(); id != "" || n != 0 {
		t.Fatalf("staging kept after a gap: %s %d", id, n)
	}
	if r := h.one(cmds[len(cmds)-1]); r.Err == nil || r.Restore != nil {
		t.Fatalf("a commit without its chunks: %+v", r)
	}
	if l := h.f.Lease("A"); l.State != fsm.StateReleased {
		t.Fatalf("lease A after a refused restore: %+v", l)
	}

	// Another restore's first chunk replaces a staged one.
	h.one(cmds[0])
	other := rechunk(t, "r2", backup, len(backup))
	h.one(other[0])
	if r := h.one(cmds[1]); r.Err == nil {
		t.Fatal("a chunk of a replaced restore was accepted")
	}

	// A commit naming another hash is refused.
	for _, c := range cmds[:len(cmds)-1] {
		if r := h.one(c); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	bad := *cmds[len(cmds)-1].(*fsm.RestoreCommit)
	bad.SHA256[0] ^= 1
	if r := h.one(&bad); r.Err == nil || r.Restore != nil {
		t.Fatalf("a commit with the wrong hash: %+v", r)
	}
	if id, _, _ := h.f.Staged(); id != "" {
		t.Fatal("staging kept after a refused commit")
	}

	// Chunks without a commit are dropped after RestoreStaleMS.
	for _, c := range cmds[:len(cmds)-1] {
		h.one(c)
	}
	h.tick(fsm.RestoreStaleMS / periodMS)
	if id, _, _ := h.f.Staged(); id == "" {
		t.Fatal("staging dropped too soon")
	}
	h.tick(1)
	if id, _, _ := h.f.Staged(); id != "" {
		t.Fatal("stale staging kept")
	}
	if r := h.one(cmds[len(cmds)-1]); r.Err == nil {
		t.Fatal("a commit after its staging was dropped applied")
	}

	// A damaged chunk does not decode.
	ch := *cmds[0].(*fsm.RestoreChunk)
	ch.Data = bytes.Clone(ch.Data)
	b, err := fsm.Encode(&ch)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-8] ^= 0x40
	if _, err := fsm.Decode(b); err == nil {
		t.Fatal("a chunk whose data does not match its checksum decoded")
	}
	// Restore entries never travel in a batch.
	if _, err := fsm.Encode(&fsm.Batch{Commands: []fsm.Command{cmds[0]}}); err == nil {
		t.Fatal("a restore chunk was encoded in a batch")
	}
}

// TestRestoreStagedInSnapshot: a snapshot taken between chunks carries them;
// a replica started from it commits the restore like the others.
func TestRestoreStagedInSnapshot(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("A", "k", "alice", 100))
	backup := snapshotBytes(t, h.f)
	h.one(release("A"))
	cmds := rechunk(t, "r1", backup, 1+len(backup)/3)
	h.one(cmds[0])
	mid := snapshotBytes(t, h.f)
	twin := &harness{t: t, f: fsm.New(), index: h.index}
	if err := twin.f.Restore(bytes.NewReader(mid)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapshotBytes(t, twin.f), mid) {
		t.Fatal("a snapshot with a staged restore does not round-trip")
	}
	for _, c := range cmds[1:] {
		r1, r2 := h.one(c), twin.one(c)
		if r1.Err != nil || r2.Err != nil {
			t.Fatal(r1.Err, r2.Err)
		}
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, twin.f)) {
		t.Fatal("the replica started between chunks differs after the commit")
	}
	if l := h.f.Lease("A"); l == nil || l.State != fsm.StateActive {
		t.Fatalf("the file's lease did not come back: %+v", l)
	}
}

// TestRestoreDuringBacklog is a restore committed while a session's end is
// still being worked off: the session ended in a chunk that could not end
// all its leases (L2, L3 wait in the backlog), and the backup, taken before
// L2 and L3 existed, has the session active. The leases left due must end
// (they are not live: their session ended), the session comes back as the
// file has it, and once time runs on, nothing is left active on any
// replica. (Rebased as they were, L2 and L3 stayed active, bound to the
// restored session without being on its list: when it ended again they
// stayed active for ever on a replica that applied the restore, while one
// started from a later snapshot ended them.)
func TestRestoreDuringBacklog(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(session("S", "s", 3))
	h.one(bound("L1", "k1", "S"))
	backup := snapshotBytes(t, h.f)
	h.one(bound("L2", "k2", "S"))
	h.one(bound("L3", "k3", "S"))
	limited := func() {
		next := h.f.Tick() + 1
		h.one(&fsm.Tick{Tick: next, WallMS: int64(next) * periodMS, PeriodMS: periodMS, ExpireMax: 1})
	}
	for range 20 {
		if s := h.f.Session("S"); s.State != fsm.SessionActive {
			break
		}
		limited()
	}
	if s := h.f.Session("S"); s.State == fsm.SessionActive || h.f.Backlog() == 0 {
		t.Fatalf("setup: session %s with backlog %d; want it ended with leases left due", s.State, h.f.Backlog())
	}
	due := 0
	for _, id := range []string{"L1", "L2", "L3"} {
		if h.f.Due(h.f.Lease(id)) {
			due++
		}
	}
	if due == 0 {
		t.Fatal("setup: no lease left due")
	}
	restoreInto(t, h, backup)
	for _, id := range []string{"L2", "L3"} {
		if l := h.f.Lease(id); l.State == fsm.StateActive {
			t.Fatalf("lease %s left due by its session's end is active after the restore: %+v", id, l)
		}
	}
	if s := h.f.Session("S"); s.State != fsm.SessionActive {
		t.Fatalf("the file's session did not come back: %+v", s)
	}
	twin := &harness{t: t, f: fsm.New(), index: h.index}
	if err := twin.f.Restore(bytes.NewReader(snapshotBytes(t, h.f))); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		for _, x := range []*harness{h, twin} {
			next := x.f.Tick() + 1
			x.one(&fsm.Tick{Tick: next, WallMS: int64(next) * periodMS, PeriodMS: periodMS, ExpireMax: 1})
			for x.f.Backlog() > 0 {
				x.one(&fsm.Expire{Tick: x.f.Tick(), WallMS: int64(x.f.Tick()) * periodMS, Max: 1})
			}
		}
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, twin.f)) {
		t.Fatal("replicas differ after the restored session ended")
	}
	if ls, _ := h.f.Leases(fsm.LeaseFilter{State: fsm.StateActive}); len(ls) > 0 {
		t.Fatalf("%d leases active after their session ended: %+v", len(ls), ls[0])
	}
}
