package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestSealCheck: a valid SealCheck records the check value (a later one
// replaces it), bad ones are refused; it survives the log codec (alone and
// in a batch) and a snapshot, with or without a cluster id; a snapshot from
// before seal checks restores to none; a rebase keeps the running state's.
func TestSealCheck(t *testing.T) {
	h := newHarness(t)
	if got := h.f.SealCheck(); got != nil {
		t.Fatalf("new state has seal check %x", got)
	}
	plain := snapshotBytes(t, h.f)
	for _, bad := range [][]byte{nil, {}, bytes.Repeat([]byte{1}, fsm.MaxSealCheckBytes+1)} {
		if r := h.one(&fsm.SealCheck{Check: bad}); r.Err == nil || r.Err.Code != wire.CodeInvalidArgument {
			t.Fatalf("seal check %x: %+v", bad, r.Err)
		}
	}
	// Without a cluster id: the header carries a zero member count and an
	// empty id before the check.
	if r := h.one(&fsm.SealCheck{Check: []byte("check-1")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	snap := snapshotBytes(t, h.f)
	g := fsm.New()
	if err := g.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if got := string(g.SealCheck()); got != "check-1" || g.ClusterID() != "" {
		t.Fatalf("restored seal check %q, cluster id %q", got, g.ClusterID())
	}
	if !bytes.Equal(snapshotBytes(t, g), snap) {
		t.Fatal("the restored state snapshots to other bytes")
	}
	// With a cluster id, and replaced by a later check (a rotation).
	h.one(&fsm.ClusterID{ID: "c-1"})
	if r := h.one(&fsm.SealCheck{Check: []byte("check-2")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	withID := snapshotBytes(t, h.f)
	if err := g.Restore(bytes.NewReader(withID)); err != nil {
		t.Fatal(err)
	}
	if got := string(g.SealCheck()); got != "check-2" || g.ClusterID() != "c-1" {
		t.Fatalf("restored seal check %q, cluster id %q", got, g.ClusterID())
	}
	// A snapshot from before seal checks restores to none.
	if err := g.Restore(bytes.NewReader(plain)); err != nil {
		t.Fatal(err)
	}
	if g.SealCheck() != nil {
		t.Fatalf("an old snapshot restored seal check %x", g.SealCheck())
	}
	// A backup restored over a running state keeps the running check.
	old := fsm.New()
	if err := old.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	old.Rebase(h.f, h.f.Index()+1)
	if got := string(old.SealCheck()); got != "check-2" {
		t.Fatalf("rebased seal check %q, want the running state's", got)
	}

	for _, c := range []fsm.Command{&fsm.SealCheck{Check: []byte{9, 9}}, &fsm.Batch{Commands: []fsm.Command{&fsm.SealCheck{Check: []byte{9, 9}}}}} {
		b, err := fsm.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		d, err := fsm.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if bt, ok := d.(*fsm.Batch); ok {
			d = bt.Commands[0]
		}
		if sc, ok := d.(*fsm.SealCheck); !ok || !bytes.Equal(sc.Check, []byte{9, 9}) {
			t.Fatalf("decoded %#v", d)
		}
	}
}
