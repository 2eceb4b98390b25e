package fsm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// pruneLog is a log in which many records end in one tick, in an order
// that is not their ids' (expiries in chunks, releases in descending id
// order between them, a session released and one expired), and later ticks
// prune them at most pruneMax a tick, by age (RetainTicks) and by count
// (RetainMax), while writes go on ending more, four leases a tick released
// in descending id order. From the storm's tenth pruning tick on, every
// fifth tick carries no prune limit (a leader whose configuration lost the
// feature) and prunes all that is due, by age and count or (every other
// one) by count only, in the middle of a tick's records that limited ticks
// had begun to prune.
func pruneLog(t *testing.T, pruneMax uint64) (log [][]byte, ids []string) {
	const expireMax, retain, retainMax = 5, 4, 40
	tick := uint64(0)
	add := func(c fsm.Command) { log = append(log, mustEncode(t, c)) }
	nextTickMax := func(retain, retainMax, pruneMax uint64) {
		tick++
		add(&fsm.Tick{Tick: tick, WallMS: int64(tick) * periodMS, PeriodMS: periodMS, RetainTicks: retain,
			RetainMax: retainMax, ExpireMax: expireMax, PruneMax: pruneMax})
	}
	nextTick := func() { nextTickMax(retain, retainMax, pruneMax) }
	id := func(i int) string { h := fsm.HashOf(fmt.Sprint(i)); return fmt.Sprintf("L%x", h[:4]) }
	nextTick()
	add(session("Sa", "ha", 3))
	add(session("Sb", "hb", 3))
	var b fsm.Batch
	for i := range 160 {
		var a *fsm.Acquire
		switch {
		case i < 20:
			a = bound(id(i), fmt.Sprintf("s/%d", i), "Sa")
		case i < 40:
			a = bound(id(i), fmt.Sprintf("s/%d", i), "Sb")
		case i < 90:
			a = withLimit(acq(id(i), "sem", "h", 3), 60)
		default:
			a = withDelay(acq(id(i), fmt.Sprintf("k/%d", i), "h", 3), 1)
		}
		ids = append(ids, a.LeaseID)
		b.Commands = append(b.Commands, a)
		if len(b.Commands) == 40 {
			add(&b)
			b = fsm.Batch{}
		}
	}
	// Up to the tick they are due at, then: an Expire, releases in
	// descending order, the end of session Sb, and Expires again.
	for range 5 {
		nextTick()
	}
	add(&fsm.Expire{Tick: tick, WallMS: 1, Max: expireMax})
	var rel fsm.Batch
	for i := 159; i >= 130; i-- {
		rel.Commands = append(rel.Commands, release(id(i)))
	}
	add(&rel)
	add(&fsm.SessionEnd{SessionID: "Sb", TokenHash: tok("Sb"), WallMS: 5})
	for range 40 {
		add(&fsm.Expire{Tick: tick, WallMS: 1, Max: expireMax})
	}
	// Ticks prune, writes end leases in each.
	for i := range 90 {
		switch {
		case i >= 12 && i%10 == 4:
			nextTickMax(retain, retainMax, 0)
		case i >= 12 && i%10 == 7:
			nextTickMax(0, 6, 0) // by count only
		default:
			nextTick()
		}
		var w fsm.Batch
		for j := range 4 {
			id := fmt.Sprintf("W%02d-%d", i, j)
			w.Commands = append(w.Commands, acq(id, "w/"+id, "hw", 3))
			ids = append(ids, id)
		}
		for j := 3; j >= 0; j-- {
			w.Commands = append(w.Commands, release(fmt.Sprintf("W%02d-%d", i, j)))
		}
		add(&w)
	}
	return log, ids
}

// TestPruneChunkedDeterminism: a replica that applies the log and one
// restored from a snapshot taken after any of its entries prune the same
// records in the same entries (their snapshots are equal after each
// entry), a tick with a prune limit prunes no more records (leases and
// sessions) than it, and the prune queue lists exactly the ended records,
// with the ticks they ended at, after every entry on both replicas.
func TestPruneChunkedDeterminism(t *testing.T) {
	const pruneMax = 3
	log, ids := pruneLog(t, pruneMax)
	a := newReplica(t)
	snaps := make([][]byte, len(log))
	kept := func(f *fsm.FSM) int {
		n := 0
		for _, id := range ids {
			if f.Lease(id) != nil {
				n++
			}
		}
		for _, id := range []string{"Sa", "Sb"} {
			if f.Session(id) != nil {
				n++
			}
		}
		return n
	}
	pruned, pruning, full, unlimited := 0, 0, 0, 0
	for i, e := range log {
		before := kept(a.f)
		a.apply(uint64(i+1), e)
		snaps[i] = snapshotBytes(t, a.f)
		if err := fsm.CheckPruneQueue(a.f); err != nil {
			t.Fatalf("after entry %d: %v", i+1, err)
		}
		if n := before - kept(a.f); n > 0 {
			if c, err := fsm.Decode(e); err == nil {
				if tk, ok := c.(*fsm.Tick); ok && tk.PruneMax == 0 {
					unlimited++
					continue
				}
			}
			if n > pruneMax {
				t.Fatalf("entry %d pruned %d records, over its bound %d", i+1, n, pruneMax)
			}
			pruned += n
			pruning++
			if n == pruneMax {
				full++
			}
		}
	}
	if pruned < 150 || full < 20 || unlimited < 10 {
		t.Fatalf("%d records pruned in %d limited entries, %d of them full, and %d unlimited ticks pruned some: the log does not exercise chunked pruning",
			pruned, pruning, full, unlimited)
	}
	t.Logf("%d records pruned in %d limited entries, %d of them full; %d unlimited ticks pruned some", pruned, pruning, full, unlimited)
	for at := range log {
		c := newReplica(t)
		if err := c.f.Restore(bytes.NewReader(snaps[at])); err != nil {
			t.Fatalf("restore after entry %d: %v", at+1, err)
		}
		for i := at + 1; i < len(log); i++ {
			index := uint64(i + 1)
			c.apply(index, log[i])
			if c.trace[index] != a.trace[index] {
				t.Fatalf("restored after entry %d, entry %d differs:\n%s\n%s", at+1, index, c.trace[index], a.trace[index])
			}
			if !bytes.Equal(snapshotBytes(t, c.f), snaps[i]) {
				t.Fatalf("restored after entry %d: state after entry %d differs", at+1, index)
			}
			if err := fsm.CheckPruneQueue(c.f); err != nil {
				t.Fatalf("restored after entry %d: after entry %d: %v", at+1, index, err)
			}
		}
	}
}

// TestPrunedTickEncoding: a tick with a prune limit is a limited tick's
// bytes followed by the limit, under a type of its own; a limit of 0, a
// version-3 entry of the type and a version-1 tick with the limit are
// refused, and so is encoding a prune limit without an expiry limit.
func TestPrunedTickEncoding(t *testing.T) {
	c := &fsm.Tick{Tick: 7, WallMS: 9, PeriodMS: 100, RetainTicks: 3, RetainMax: 4, ExpireMax: 4096, PruneMax: 300}
	if got := roundTrip(t, c); jsonOf(t, got) != jsonOf(t, c) {
		t.Fatalf("%s, want %s", jsonOf(t, got), jsonOf(t, c))
	}
	limited := mustEncode(t, &fsm.Tick{Tick: 7, ExpireMax: 1})
	pruned := mustEncode(t, &fsm.Tick{Tick: 7, ExpireMax: 1, PruneMax: 2})
	if pruned[1] != byte(fsm.TypeTickPruned) || !bytes.Equal(pruned[2:len(pruned)-1], limited[2:]) || pruned[len(pruned)-1] != 2 {
		t.Fatalf("pruned tick % x, limited % x", pruned, limited)
	}
	v3 := bytes.Clone(pruned)
	v3[0] = 3
	for _, bad := range [][]byte{
		append(pruned[:len(pruned)-1:len(pruned)-1], 0),
		pruned[: len(pruned)-1 : len(pruned)-1],
		v3,
		append([]byte{1, byte(fsm.TypeTick)}, `{"tick":7,"prune_max":2}`...),
	} {
		if c, err := fsm.Decode(bad); err == nil {
			t.Errorf("% x decoded as %#v", bad, c)
		}
	}
	if _, err := fsm.Encode(&fsm.Tick{Tick: 7, PruneMax: 2}); err == nil {
		t.Error("a prune limit without an expiry limit encoded")
	}
}

// TestPruneCurrentTickOrder: a limited tick that prunes by count never
// prunes a record that ended at its own tick, even when more ended in it
// than are kept. Leases B, C and D expire in one tick that keeps 2 records
// and prunes at most 1, and lease A0 is released later in that tick. Were
// B pruned there, the replica that applied the log would list the rest of
// the tick's records [C, D, A0] and one restored after the release
// [A0, C, D], and the next tick would prune C on one and A0 on the other.
// Instead the next tick prunes A0 (the tick's first record by id) on both.
func TestPruneCurrentTickOrder(t *testing.T) {
	a := newReplica(t)
	var log, snaps [][]byte
	add := func(c fsm.Command) {
		log = append(log, mustEncode(t, c))
		a.apply(uint64(len(log)), log[len(log)-1])
		snaps = append(snaps, snapshotBytes(t, a.f))
	}
	tick := uint64(0)
	nextTick := func() {
		tick++
		add(&fsm.Tick{Tick: tick, WallMS: int64(tick) * periodMS, PeriodMS: periodMS,
			RetainMax: 2, ExpireMax: 100, PruneMax: 1})
	}
	// ended reports whether lease id ended at tick.
	ended := func(id string) bool {
		l := a.f.Lease(id)
		return l != nil && l.Terminal() && l.EndedTick() == tick
	}
	nextTick()
	add(&fsm.Batch{Commands: []fsm.Command{acq("D", "k/D", "h", 3), acq("C", "k/C", "h", 3),
		acq("B", "k/B", "h", 3), acq("A0", "k/A0", "h", 30)}})
	for !ended("D") {
		if tick > 20 {
			t.Fatal("lease D never expired")
		}
		nextTick()
	}
	expired := ended("B") && ended("C") && ended("D")
	active := a.f.Lease("A0") != nil && !a.f.Lease("A0").Terminal()
	add(release("A0"))
	released := ended("A0")
	nextTick()
	pruned := [4]bool{}
	for i, id := range []string{"A0", "B", "C", "D"} {
		pruned[i] = a.f.Lease(id) == nil
	}
	nextTick()
	nextTick()
	for at := range log {
		c := newReplica(t)
		if err := c.f.Restore(bytes.NewReader(snaps[at])); err != nil {
			t.Fatalf("restore after entry %d: %v", at+1, err)
		}
		for i := at + 1; i < len(log); i++ {
			c.apply(uint64(i+1), log[i])
			if !bytes.Equal(snapshotBytes(t, c.f), snaps[i]) {
				t.Fatalf("restored after entry %d: state after entry %d differs", at+1, i+1)
			}
		}
	}
	if !expired || !active || !released {
		t.Fatalf("B, C and D expired and kept at the tick D expired: %v; A0 active then: %v; released in that tick: %v",
			expired, active, released)
	}
	if pruned != [4]bool{true, false, false, false} {
		t.Fatalf("next tick pruned (A0, B, C, D) %v, want only A0", pruned)
	}
}
