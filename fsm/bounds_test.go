package fsm_test

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestQuotaKeyWaiters: a key's queue holds at most KeyWaiters acquires; one
// more is RESOURCE_EXHAUSTED naming waiters_per_key and changes nothing;
// once a waiter gives up there is room again. Acquires that need no queue
// (a free slot) are not affected.
func TestQuotaKeyWaiters(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	q := fsm.Quota{KeyWaiters: 3}
	if r := h.one(withQuota(acq("A", "k", "alice", 50), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	for i := range 3 {
		id := fmt.Sprintf("W%d", i)
		if r := h.one(withQuota(withWait(acq(id, "k", "h"+id, 5), 20), q)); r.Err != nil || !r.Queued {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	refused(t, h, withQuota(withWait(acq("X", "k", "bob", 5), 20), q), "waiters_per_key", 3)
	// Another key has its own queue; a non-waiting acquire is LEASE_HELD.
	if r := h.one(withQuota(acq("B", "k2", "bob", 50), q)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(withWait(acq("Y", "k2", "bob", 5), 20), q)); r.Err != nil || !r.Queued {
		t.Fatalf("other key: %+v", r)
	}
	if r := h.one(withQuota(acq("Z", "k", "bob", 5), q)); code(r.Err) != wire.CodeLeaseHeld {
		t.Fatalf("no wait: %v", r.Err)
	}
	h.one(&fsm.CancelWait{LeaseID: "W1", Key: "k"})
	if r := h.one(withQuota(withWait(acq("X", "k", "bob", 5), 20), q)); r.Err != nil || !r.Queued {
		t.Fatalf("after a cancel: %+v", r)
	}
	// Zero is no limit.
	if r := h.one(withWait(acq("X2", "k", "bob", 5), 20)); r.Err != nil || !r.Queued {
		t.Fatalf("no limit: %+v", r)
	}
}

// TestQuotaHolderWaiters: a holder has at most HolderWaiters queued
// acquires across keys, counting bound acquires for the session's holder,
// and the count survives a snapshot even when the session's record is
// gone: the restored replica refuses exactly what the original does.
func TestQuotaHolderWaiters(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	q := fsm.Quota{HolderWaiters: 2}
	for _, k := range []string{"k1", "k2", "k3"} {
		if r := h.one(acq("held-"+k, k, "other", 100)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if r := h.one(session("S", "alice", 3)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withQuota(withWait(acq("W1", "k1", "alice", 5), 50), q)); r.Err != nil || !r.Queued {
		t.Fatalf("W1: %+v", r)
	}
	b := withWait(bound("W2", "k2", "S"), 50)
	b.Quota = q
	if r := h.one(b); r.Err != nil || !r.Queued {
		t.Fatalf("W2: %+v", r)
	}
	refused(t, h, withQuota(withWait(acq("W3", "k3", "alice", 5), 50), q), "waiters_per_holder", 2)
	// Another holder is not affected.
	if r := h.one(withQuota(withWait(acq("V1", "k3", "bob", 5), 50), q)); r.Err != nil || !r.Queued {
		t.Fatalf("bob: %+v", r)
	}
	// The session expires and its record is pruned; its waiter stays
	// queued (it fails when a slot frees). Restore a replica now.
	h.retain = 1
	h.tick(10)
	if h.f.Session("S") != nil {
		t.Fatal("session record not pruned")
	}
	r2 := &harness{t: t, f: restored(t, snapshotBytes(t, h.f)), index: h.index, retain: h.retain}
	for _, x := range []*harness{h, r2} {
		refused(t, x, withQuota(withWait(acq("W3", "k3", "alice", 5), 50), q), "waiters_per_holder", 2)
	}
	// Releasing the holder drops its waiters; room again.
	for _, x := range []*harness{h, r2} {
		if r := x.one(&fsm.ReleaseHolder{Holder: "alice"}); r.Err != nil || r.Count != 2 {
			t.Fatalf("release holder: %+v", r)
		}
		if r := x.one(withQuota(withWait(acq("W3", "k3", "alice", 5), 50), q)); r.Err != nil || !r.Queued {
			t.Fatalf("after release holder: %+v", r)
		}
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, r2.f)) {
		t.Fatal("restored replica diverged")
	}
}

// TestWaitQueueOrder: with waiters giving up (cancel, timeout, holder
// released) out of order, the survivors are granted first come first
// served, and a replica restored mid-way stays identical.
func TestWaitQueueOrder(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	if r := h.one(withLimit(acq("A", "k", "x", 1000), 2)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(withLimit(acq("B", "k", "x", 1000), 2)); r.Err != nil {
		t.Fatal(r.Err)
	}
	const n = 300
	var want []string
	for i := range n {
		id := fmt.Sprintf("W%03d", i)
		holder := fmt.Sprintf("h%d", i%7)
		wait := uint64(1000)
		if i%5 == 0 {
			wait = uint64(2 + i%11) // staggered timeouts
		}
		if r := h.one(withLimit(withWait(acq(id, "k", holder, 1000), wait), 2)); r.Err != nil || !r.Queued {
			t.Fatalf("%s: %+v", id, r)
		}
		if i%5 != 0 && i%3 != 0 && i%7 != 3 {
			want = append(want, id)
		}
	}
	for i := range n {
		if i%3 == 0 && i%5 != 0 {
			h.one(&fsm.CancelWait{LeaseID: fmt.Sprintf("W%03d", i), Key: "k"})
		}
	}
	h.tick(15)
	r2 := &harness{t: t, f: restored(t, snapshotBytes(t, h.f)), index: h.index}
	var got [2][]string
	for j, x := range []*harness{h, r2} {
		x.one(&fsm.ReleaseHolder{Holder: "h3"})
		x.allNotices = nil
		// Free slots one at a time: each grants the next survivor.
		for _, id := range []string{"A", "B"} {
			x.one(release(id))
		}
		for len(got[j]) < len(want) {
			var granted []string
			for _, no := range x.allNotices {
				if no.Lease != nil {
					granted = append(granted, no.LeaseID)
				}
			}
			x.allNotices = nil
			if len(granted) == 0 {
				t.Fatalf("replica %d: nothing granted after %v", j, got[j])
			}
			got[j] = append(got[j], granted...)
			for _, id := range granted {
				x.one(release(id))
			}
		}
	}
	if !slices.Equal(got[0], want) || !slices.Equal(got[1], want) {
		t.Fatalf("grant order\n got %v\n and %v\nwant %v", got[0], got[1], want)
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, r2.f)) {
		t.Fatal("restored replica diverged")
	}
}

// TestWaitQueueCancelCost: withdrawing one waiter of a long queue does not
// copy the queue. (Before the queue was indexed, each cancel cloned it: a
// thousand cancels of a 10,000-waiter queue allocated about 150 MB.) The
// bound counts bytes, not time.
func TestWaitQueueCancelCost(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	if r := h.one(acq("A", "k", "x", 1000)); r.Err != nil {
		t.Fatal(r.Err)
	}
	const n = 10000
	cmds := make([]fsm.Command, 0, fsm.MaxBatch)
	flush := func() {
		if len(cmds) > 0 {
			h.apply(&fsm.Batch{Commands: cmds})
			cmds = cmds[:0]
		}
	}
	for i := range n {
		cmds = append(cmds, withWait(acq(fmt.Sprintf("W%05d", i), "k", "h", 1000), 1000))
		if len(cmds) == fsm.MaxBatch {
			flush()
		}
	}
	flush()
	cancels := make([]fsm.Command, 0, 1000)
	for i := range 1000 {
		cancels = append(cancels, &fsm.CancelWait{LeaseID: fmt.Sprintf("W%05d", n-1-i*3), Key: "k"})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, c := range cancels {
		h.f.Apply(h.index+1, c)
		h.index++
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 32<<20 {
		t.Fatalf("1000 cancels of a %d-waiter queue allocated %d bytes", n, got)
	}
	if l := len(h.f.TakeNotices()); l != 0 {
		t.Fatalf("%d notices", l)
	}
}

// TestRetainMax: with RetainMax set, at most that many ended records are
// kept after each tick, the oldest pruned first, whole ticks at a time, on
// a restored replica exactly as on the original.
func TestRetainMax(t *testing.T) {
	h := newHarness(t)
	h.retain = 1 << 20 // age alone never prunes here
	h.retainMax = 10
	h.tick(1)
	var r2 *harness
	for i := range 40 {
		if i == 17 {
			r2 = &harness{t: t, f: restored(t, snapshotBytes(t, h.f)), index: h.index, retain: h.retain, retainMax: h.retainMax}
		}
		for _, x := range []*harness{h, r2} {
			if x == nil {
				continue
			}
			// Three records end in each tick: two leases and a session,
			// ending in an order that is not their id order.
			ids := []string{fmt.Sprintf("L%02db", i), fmt.Sprintf("L%02da", i)}
			for _, id := range ids {
				if r := x.one(acq(id, "k"+id, "h", 100)); r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			sid := fmt.Sprintf("S%02d", i)
			x.one(session(sid, "h", 100))
			x.one(&fsm.SessionEnd{SessionID: sid, TokenHash: tok(sid)})
			for _, id := range ids {
				x.one(release(id))
			}
			x.tick(1)
		}
	}
	for j, x := range []*harness{h, r2} {
		ls, _ := x.f.Leases(fsm.LeaseFilter{})
		ss, _ := x.f.Sessions("", "", 0)
		if n := len(ls) + len(ss); n > 10 || n < 8 {
			t.Fatalf("replica %d keeps %d ended records, want at most 10 (whole ticks: 9)", j, n)
		}
		// The newest three ticks are kept, nothing older.
		for _, i := range []int{37, 38, 39} {
			if x.f.Lease(fmt.Sprintf("L%02da", i)) == nil || x.f.Session(fmt.Sprintf("S%02d", i)) == nil {
				t.Fatalf("replica %d: records of round %d pruned", j, i)
			}
		}
		if x.f.Lease("L36a") != nil || x.f.Lease("L36b") != nil || x.f.Session("S36") != nil {
			t.Fatalf("replica %d: records of round 36 kept", j)
		}
	}
	if !bytes.Equal(snapshotBytes(t, h.f), snapshotBytes(t, r2.f)) {
		t.Fatal("restored replica diverged")
	}
	// Active records are never pruned, and zero is no bound.
	h.retainMax = 1
	if r := h.one(acq("live", "klive", "h", 1000)); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.tick(1)
	if l := h.f.Lease("live"); l == nil || l.State != fsm.StateActive {
		t.Fatal("active lease pruned")
	}
}

// TestListScanBound: a listing with a Scan bound looks at no more than
// that many records: a prefix that matches nothing returns an empty page
// with a cursor, and following the cursors yields exactly the unbounded
// listing. Sessions likewise.
func TestListScanBound(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	var all []string
	for i := range 50 {
		id := fmt.Sprintf("L%02d", i)
		key := "a/" + id
		if i%4 == 0 {
			key = "b/" + id
		}
		if r := h.one(acq(id, key, "h", 100)); r.Err != nil {
			t.Fatal(r.Err)
		}
		h.one(session(fmt.Sprintf("S%02d", i), fmt.Sprintf("h%d", i%4), 100))
		if i%4 == 0 {
			all = append(all, id)
		}
	}
	// A prefix no key has is answered from the key index: no walk at all.
	for _, p := range []string{"zz", "a/x", "b/L00x", "0", "c"} {
		if ls, next := h.f.Leases(fsm.LeaseFilter{Prefix: p, Limit: 10, Scan: 7}); len(ls) != 0 || next != "" {
			t.Fatalf("prefix %q matching no key: %d leases, next %q", p, len(ls), next)
		}
	}
	// Keys that match but records that do not: a bounded walk.
	ls, next := h.f.Leases(fsm.LeaseFilter{Prefix: "a/", State: fsm.StateRevoked, Limit: 10, Scan: 7})
	if len(ls) != 0 || next != "L06" {
		t.Fatalf("filter matching nothing: %d leases, next %q; want none and L06", len(ls), next)
	}
	var got []string
	pages := 0
	for after := ""; ; pages++ {
		if pages > 100 {
			t.Fatal("no end to the pages")
		}
		ls, next := h.f.Leases(fsm.LeaseFilter{Prefix: "b/", After: after, Limit: 3, Scan: 7})
		if len(ls) > 3 {
			t.Fatalf("page of %d", len(ls))
		}
		for _, l := range ls {
			got = append(got, l.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if !slices.Equal(got, all) {
		t.Fatalf("paged listing %v, want %v", got, all)
	}
	var sess []string
	for after := ""; ; {
		ss, next := h.f.SessionsScan("h1", after, 2, 5)
		for _, s := range ss {
			sess = append(sess, s.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	want, _ := h.f.Sessions("h1", "", 0)
	if len(sess) != len(want) || len(want) != 13 {
		t.Fatalf("paged sessions %v, want %d", sess, len(want))
	}
}

// TestKeyIndex: the key index behind prefix listings follows the lease
// records: a key's records pruned, its prefix finds nothing, on the
// original and on a restored replica alike.
func TestKeyIndex(t *testing.T) {
	h := newHarness(t)
	h.retain = 5
	h.tick(1)
	for _, id := range []string{"A", "B"} {
		if r := h.one(acq(id, "jobs/"+id, "h", 100)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	h.one(release("A"))
	if r := h.one(acq("A2", "jobs/A", "h", 100)); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.one(release("A2"))
	h.one(release("B"))
	count := func(f *fsm.FSM, p string) int {
		ls, _ := f.Leases(fsm.LeaseFilter{Prefix: p})
		return len(ls)
	}
	r2 := restored(t, snapshotBytes(t, h.f))
	for _, f := range []*fsm.FSM{h.f, r2} {
		if count(f, "jobs/") != 3 || count(f, "jobs/A") != 2 || count(f, "jobs/B") != 1 {
			t.Fatalf("before pruning: %d, %d, %d", count(f, "jobs/"), count(f, "jobs/A"), count(f, "jobs/B"))
		}
	}
	h.tick(10)
	r3 := restored(t, snapshotBytes(t, h.f))
	for _, f := range []*fsm.FSM{h.f, r3} {
		if count(f, "jobs/") != 0 || count(f, "jobs/A") != 0 {
			t.Fatal("pruned records listed")
		}
	}
	if r := h.one(acq("C", "jobs/A", "h", 100)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if count(h.f, "jobs/") != 1 {
		t.Fatal("a new record not found by prefix")
	}
}
