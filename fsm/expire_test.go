package fsm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// stormLog is the log of a storm larger than one chunk: n standalone
// leases (every tenth with a lock-delay) and a session with nb bound
// leases, all due at the same tick, then limited ticks and Expire entries
// of chunk records each, with client writes between them.
type stormLog struct {
	entries [][]byte
	due     uint64 // the tick at which everything is due
	first   int    // position in entries of the due tick
}

const stormChunk = 128

func newStormLog(t *testing.T, n, nb int) *stormLog {
	s := &stormLog{}
	add := func(c fsm.Command) { s.entries = append(s.entries, mustEncode(t, c)) }
	tick := uint64(1)
	add(&fsm.Tick{Tick: tick, WallMS: periodMS, PeriodMS: periodMS, ExpireMax: stormChunk})
	add(session("S", "sh", 3))
	for i := 0; i < n; i += 100 {
		b := &fsm.Batch{}
		for j := i; j < min(n, i+100); j++ {
			a := acq(fmt.Sprintf("s%04d", j), fmt.Sprintf("k%04d", j), fmt.Sprintf("h%d", j%7), 3)
			if j%10 == 0 {
				a = withDelay(a, 2)
			}
			b.Commands = append(b.Commands, a)
		}
		add(b)
	}
	for i := 0; i < nb; i += 100 {
		b := &fsm.Batch{}
		for j := i; j < min(nb, i+100); j++ {
			b.Commands = append(b.Commands, bound(fmt.Sprintf("b%04d", j), fmt.Sprintf("bk%04d", j), "S"))
		}
		add(b)
	}
	// Queued behind a lease of the storm: granted when it ends.
	add(withWait(acq("w1", "k0999", "other", 50), 20))
	s.due = tick + 3 + fsm.GraceTicks
	// A waiter that times out and a lock-delay that ends at the same
	// tick: the backlog holds every kind of timer.
	add(acq("long", "held", "other", 100))
	add(withWait(acq("w2", "held", "other2", 50), s.due-tick))
	add(withWait(acq("w0", "held", "other3", 50), s.due-tick)) // times out first: ids order
	add(withDelay(acq("d1", "a-delay", "other", 100), 2))
	for tick < s.due {
		tick++
		if tick == s.due {
			s.first = len(s.entries)
		}
		add(&fsm.Tick{Tick: tick, WallMS: int64(tick) * periodMS, PeriodMS: periodMS, RetainTicks: 100, ExpireMax: stormChunk})
		if tick == s.due-3 {
			add(&fsm.Revoke{LeaseID: "d1", WallMS: 7}) // blocked until due-3+2+1
		}
	}
	for i := 0; i < (n+nb)/stormChunk+3; i++ {
		// Client writes between chunks: a renewal, a release and an
		// acquire on the key of leases that are due, a heartbeat of the
		// due session, and an acquire on a fresh key.
		j := (i * 97) % n
		add(&fsm.Batch{Commands: []fsm.Command{
			renew(fmt.Sprintf("s%04d", j)),
			release(fmt.Sprintf("s%04d", (j+1)%n)),
			acq(fmt.Sprintf("new%d", i), fmt.Sprintf("k%04d", (j+2)%n), "late", 50),
			&fsm.SessionHeartbeat{SessionID: "S", TokenHash: tok("S"), WallMS: 5},
			renew(fmt.Sprintf("b%04d", (i*31)%nb)),
			acq(fmt.Sprintf("fresh%d", i), fmt.Sprintf("fresh/%d", i), "late", 50),
		}})
		add(&fsm.Expire{Tick: s.due, WallMS: int64(s.due) * periodMS, Max: stormChunk})
	}
	return s
}

// TestChunkedExpiryStorm: a storm larger than one chunk ends completely, a
// chunk at a time with writes committing between chunks; a due lease can be
// neither renewed nor released nor replaced before its chunk ends it; and a
// replica replaying the log, or restored from a snapshot taken between
// chunks, sees and holds exactly the same.
func TestChunkedExpiryStorm(t *testing.T) {
	const n, nb = 1000, 700
	s := newStormLog(t, n, nb)
	a, b := newReplica(t), newReplica(t)
	mids := map[int][]byte{} // position in the log -> snapshot before it
	chunks, interleaved := 0, 0
	for i, e := range s.entries {
		index := uint64(i + 1)
		backlogBefore := a.f.Backlog()
		res := a.apply(index, e)
		b.apply(index, e)
		if a.trace[index] != b.trace[index] {
			t.Fatalf("entry %d: replicas disagree:\n%s\n%s", index, a.trace[index], b.trace[index])
		}
		if i < s.first {
			if a.f.Backlog() != 0 {
				t.Fatalf("entry %d: backlog %d before anything is due", index, a.f.Backlog())
			}
			if l := a.f.Lease("s0000"); l != nil && a.f.Due(l) {
				t.Fatalf("entry %d: lease s0000 due before its tick: %+v", index, l)
			}
			continue
		}
		// Every storm lease still active once its tick applied is due: a
		// validation answers it as expired (Due), none is due once ended.
		for j := 0; j < n; j += 50 {
			l := a.f.Lease(fmt.Sprintf("s%04d", j))
			if l != nil && l.Terminal() == a.f.Due(l) {
				t.Fatalf("entry %d: lease %s state %s, due %v", index, l.ID, l.State, a.f.Due(l))
			}
		}
		ended := 0
		for _, ev := range a.events {
			if ev.Type == fsm.EventExpired {
				ended++
			}
		}
		c, _ := fsm.Decode(e)
		switch c := c.(type) {
		case *fsm.Tick, *fsm.Expire:
			if ended > stormChunk {
				t.Fatalf("entry %d (%T): %d leases expired, chunk is %d", index, c, ended, stormChunk)
			}
			if ended > 0 {
				chunks++
			}
		case *fsm.Batch:
			if ended != 0 {
				t.Fatalf("entry %d: client writes expired %d leases", index, ended)
			}
			if backlogBefore > 0 {
				interleaved++
			}
			checkStormWrites(t, a.f, index, c, res)
		}
		if a.f.Backlog() > 0 {
			mids[i+1] = snapshotBytes(t, a.f)
		}
	}
	if a.f.Backlog() != 0 {
		t.Fatalf("backlog %d left after the log", a.f.Backlog())
	}
	if chunks < (n+nb)/stormChunk || interleaved < 5 {
		t.Fatalf("%d chunks, %d write entries between them: the storm was not chunked", chunks, interleaved)
	}
	for j := range n {
		if l := a.f.Lease(fmt.Sprintf("s%04d", j)); l.State == fsm.StateActive {
			t.Fatalf("lease %s still active", l.ID)
		}
	}
	for j := range nb {
		l := a.f.Lease(fmt.Sprintf("b%04d", j))
		if l.State != fsm.StateExpired || l.EndReason() != fsm.ReasonSessionEnded || l.EndedTick() != s.due {
			t.Fatalf("bound lease %+v", l)
		}
	}
	if sess := a.f.Session("S"); sess.State != fsm.SessionExpired {
		t.Fatalf("session %+v", sess)
	}
	w := a.f.Lease("w1")
	if w == nil || w.State != fsm.StateActive || w.Fence <= a.f.Lease("s0999").Fence {
		t.Fatalf("the waiter behind s0999 was not granted after it: %+v", w)
	}
	final := snapshotBytes(t, a.f)
	if got := snapshotBytes(t, b.f); !bytes.Equal(got, final) {
		t.Fatal("the replaying replica's state differs")
	}

	if l := a.f.Lease("w2"); l != nil || len(a.f.ActiveOnKey("a-delay")) != 0 {
		t.Fatalf("waiter w2 %+v", l)
	}

	// Restored between any two chunks, a replica ends the rest
	// identically.
	if len(mids) < chunks/2 {
		t.Fatalf("%d snapshots taken between chunks", len(mids))
	}
	for at, mid := range mids {
		c := newReplica(t)
		if err := c.f.Restore(bytes.NewReader(mid)); err != nil {
			t.Fatal(err)
		}
		if c.f.Backlog() == 0 {
			t.Fatal("the restored replica has no backlog")
		}
		for i := at; i < len(s.entries); i++ {
			index := uint64(i + 1)
			c.apply(index, s.entries[i])
			if c.trace[index] != a.trace[index] {
				t.Fatalf("restored at %d, entry %d differs:\n%s\n%s", at, index, c.trace[index], a.trace[index])
			}
		}
		if got := snapshotBytes(t, c.f); !bytes.Equal(got, final) {
			t.Fatalf("restored at %d: state differs", at)
		}
	}
}

// checkStormWrites checks the client writes applied between two chunks: no
// due lease was renewed or released, the due session was not heartbeaten,
// a key was granted only once its lease had ended, and fresh keys were.
func checkStormWrites(t *testing.T, f *fsm.FSM, index uint64, b *fsm.Batch, res []fsm.Result) {
	t.Helper()
	for k, c := range b.Commands {
		r := res[k]
		switch c := c.(type) {
		case *fsm.Renew:
			wantCode(t, fmt.Sprintf("entry %d: renew %s", index, c.LeaseID), r.Err, wire.CodeLeaseExpired)
		case *fsm.Release:
			if r.Err == nil || r.Err.Code != wire.CodeLeaseExpired && r.Err.Code != wire.CodeLeaseReleased {
				t.Fatalf("entry %d: release of due lease %s: %v", index, c.LeaseID, r.Err)
			}
		case *fsm.SessionHeartbeat:
			wantCode(t, fmt.Sprintf("entry %d: heartbeat", index), r.Err, wire.CodeSessionEnded)
		case *fsm.Acquire:
			if c.Holder != "late" {
				break
			}
			active := f.ActiveOnKey(c.Key)
			if len(active) > 1 {
				t.Fatalf("entry %d: %d holders of %s", index, len(active), c.Key)
			}
			if r.Err == nil && (len(active) != 1 || active[0].ID != c.LeaseID) {
				t.Fatalf("entry %d: %s granted but %s holds %v", index, c.LeaseID, c.Key, active)
			}
			if r.Err != nil && r.Err.Code != wire.CodeLeaseHeld && r.Err.Code != wire.CodeLockDelay {
				t.Fatalf("entry %d: acquire %s: %v", index, c.Key, r.Err)
			}
		}
	}
}

// TestChunkedEncoding: a limited tick and an Expire survive the log
// encoding; a tick without a limit is written as before (type 2); a zero
// limit in either is refused.
func TestChunkedEncoding(t *testing.T) {
	for _, c := range []fsm.Command{
		&fsm.Tick{Tick: 7, WallMS: 9, PeriodMS: 100, RetainTicks: 3, RetainMax: 4, ExpireMax: 4096},
		&fsm.Expire{Tick: 7, WallMS: 9, Max: 1},
		&fsm.Batch{Commands: []fsm.Command{&fsm.Tick{Tick: 1, ExpireMax: 2}, &fsm.Expire{Tick: 1, Max: 3}}},
	} {
		if got := roundTrip(t, c); jsonOf(t, got) != jsonOf(t, c) {
			t.Fatalf("%T: %s, want %s", c, jsonOf(t, got), jsonOf(t, c))
		}
	}
	plain := mustEncode(t, &fsm.Tick{Tick: 7})
	if plain[1] != byte(fsm.TypeTick) {
		t.Fatalf("an unlimited tick is written as type %d", plain[1])
	}
	limited := mustEncode(t, &fsm.Tick{Tick: 7, ExpireMax: 1})
	if limited[1] != byte(fsm.TypeTickLimited) || !bytes.Equal(limited[2:len(limited)-1], plain[2:]) {
		t.Fatalf("limited tick % x, unlimited % x", limited, plain)
	}
	for _, bad := range [][]byte{
		append(limited[:len(limited)-1:len(limited)-1], 0),
		append(mustEncode(t, &fsm.Expire{Tick: 7, Max: 1})[:4:4], 0),
		{3, byte(fsm.TypeExpire), 7, 0, 1},
		{1, byte(fsm.TypeExpire), '{', '}'},
	} {
		if c, err := fsm.Decode(bad); err == nil {
			t.Errorf("% x decoded as %#v", bad, c)
		}
	}
}

// TestSessionLeaseIDsCopyOnWrite: binding leases to a session appends to its
// list in place, but a version of the session held before (by an event or a
// snapshot) still lists only the leases it had.
func TestSessionLeaseIDsCopyOnWrite(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(session("S", "sh", 10))
	h.one(bound("A", "ka", "S"))
	old := h.f.Session("S")
	snap := h.f.Snapshot()
	h.one(bound("B", "kb", "S"))
	h.one(&fsm.SessionHeartbeat{SessionID: "S", TokenHash: tok("S"), WallMS: 5})
	h.one(bound("C", "kc", "S"))
	if got := old.LeaseIDs; len(got) != 1 || got[0] != "A" {
		t.Fatalf("the older version lists %v", got)
	}
	if got := h.f.Session("S").LeaseIDs; fmt.Sprint(got) != "[A B C]" {
		t.Fatalf("the session lists %v", got)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g := fsm.New()
	if err := g.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := g.Session("S").LeaseIDs; fmt.Sprint(got) != "[A]" {
		t.Fatalf("the snapshot taken before B lists %v", got)
	}
}

// TestDeterminismChunked: random logs whose ticks end at most a record or
// two, with Expire entries (some stale) among the writes. Replicas agree
// entry by entry; one restored from a snapshot taken while records were due
// and not yet ended continues identically; no key ever has more holders
// than its limit and tokens only grow per key; and whenever nothing is
// left due, nothing is overdue.
func TestDeterminismChunked(t *testing.T) {
	const seeds, entries = 6, 1500
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			g := newGen(seed, true)
			g.chunk = 2
			g.groups = true
			if seed%2 == 0 {
				g.prune = 1 // and chunked pruning
			}
			log := genLog(t, g, entries)
			a, b := newReplica(t), newReplica(t)
			snaps := map[int][]byte{} // position in the log -> snapshot before it
			fence := map[string]uint64{}
			backlogged := 0
			for i, e := range log {
				index := uint64(i + 1)
				a.apply(index, e)
				b.apply(index, e)
				if a.trace[index] != b.trace[index] {
					t.Fatalf("entry %d: replicas disagree:\n%s\n%s", index, a.trace[index], b.trace[index])
				}
				for _, ev := range a.events {
					if ev.Type != fsm.EventAcquired {
						continue
					}
					if ev.Lease.Fence <= fence[ev.Key] {
						t.Fatalf("entry %d: %s granted fence %d after %d", index, ev.Key, ev.Lease.Fence, fence[ev.Key])
					}
					fence[ev.Key] = ev.Lease.Fence
				}
				for _, k := range genKeys {
					if n := len(a.f.ActiveOnKey(k)); n > int(genLimits[k]) {
						t.Fatalf("entry %d: %d holders of %s (limit %d)", index, n, k, genLimits[k])
					}
				}
				if a.f.Backlog() > 0 {
					backlogged++
					if backlogged%5 == 1 {
						snaps[i+1] = snapshotBytes(t, a.f)
					}
				} else if err := checkKeys(a.f, snapshotBytes(t, a.f)); err != nil {
					t.Fatalf("entry %d: %v", index, err)
				}
			}
			if backlogged < 50 {
				t.Fatalf("records were left due after only %d entries", backlogged)
			}
			final := snapshotBytes(t, a.f)
			if !bytes.Equal(final, snapshotBytes(t, b.f)) {
				t.Fatal("final states differ")
			}
			for at, snap := range snaps {
				c := newReplica(t)
				if err := c.f.Restore(bytes.NewReader(snap)); err != nil {
					t.Fatalf("restore at %d: %v", at, err)
				}
				for i := at; i < len(log); i++ {
					index := uint64(i + 1)
					c.apply(index, log[i])
					if c.trace[index] != a.trace[index] {
						t.Fatalf("restored at %d, entry %d differs:\n%s\n%s", at, index, c.trace[index], a.trace[index])
					}
				}
				if !bytes.Equal(snapshotBytes(t, c.f), final) {
					t.Fatalf("restored at %d: final state differs", at)
				}
			}
		})
	}
}

// TestExpireLockDelayFromNextTick: an expiry applied by an Expire entry,
// between two ticks, blocks its key one tick longer than one applied by the
// tick itself, as a revoke's does, so that the whole lock-delay passes after
// the lease has actually ended.
func TestExpireLockDelayFromNextTick(t *testing.T) {
	h := newHarness(t)
	h.one(&fsm.Tick{Tick: 1, WallMS: periodMS, PeriodMS: periodMS, ExpireMax: 1})
	h.one(withDelay(acq("A", "ka", "h", 2), 2))
	h.one(withDelay(acq("B", "kb", "h", 2), 2))
	due := uint64(1 + 2 + fsm.GraceTicks)
	for tick := uint64(2); tick <= due; tick++ {
		h.one(&fsm.Tick{Tick: tick, WallMS: int64(tick) * periodMS, PeriodMS: periodMS, ExpireMax: 1})
	}
	if a, b := h.f.Lease("A"), h.f.Lease("B"); a.State != fsm.StateExpired || b.State != fsm.StateActive {
		t.Fatalf("after the tick: A %s, B %s", a.State, b.State)
	}
	h.one(&fsm.Expire{Tick: due, WallMS: 9, Max: 1})
	if b := h.f.Lease("B"); b.State != fsm.StateExpired || b.EndedTick() != due {
		t.Fatalf("after the Expire: B %+v", b)
	}
	for _, step := range []struct {
		tick  uint64
		codeA wire.Code
		codeB wire.Code
	}{
		{due + 1, wire.CodeLockDelay, wire.CodeLockDelay},
		{due + 2, "", wire.CodeLockDelay},
		{due + 3, wire.CodeLeaseHeld, ""},
	} {
		h.tickTo(step.tick)
		id := fmt.Sprint(step.tick)
		wantCode(t, fmt.Sprintf("acquire ka at %d", step.tick), h.one(acq("a"+id, "ka", "h2", 10)).Err, step.codeA)
		wantCode(t, fmt.Sprintf("acquire kb at %d", step.tick), h.one(acq("b"+id, "kb", "h2", 10)).Err, step.codeB)
	}
}
