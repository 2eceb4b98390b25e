package fsm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/fsm"
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
