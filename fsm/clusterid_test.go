package fsm_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestClusterID: the first valid ClusterID sets the identity, another one
// afterwards is refused and changes nothing, the same one again is fine;
// bad ids are refused. It survives encoding (alone and in a batch) and a
// snapshot, with or without member records.
func TestClusterID(t *testing.T) {
	h := newHarness(t)
	if got := h.f.ClusterID(); got != "" {
		t.Fatalf("new state has cluster id %q", got)
	}
	for _, bad := range []string{"", "a b", "é", strings.Repeat("x", fsm.MaxClusterIDBytes+1), "a\x00"} {
		if r := h.one(&fsm.ClusterID{ID: bad}); r.Err == nil || r.Err.Code != wire.CodeInvalidArgument {
			t.Fatalf("cluster id %q: %+v", bad, r.Err)
		}
	}
	if got := h.f.ClusterID(); got != "" {
		t.Fatalf("a refused id set cluster id %q", got)
	}
	// Without members: the header carries a zero member count, then the id.
	if r := h.one(&fsm.ClusterID{ID: "c-1"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	snap := snapshotBytes(t, h.f)
	g := fsm.New()
	if err := g.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if got := g.ClusterID(); got != "c-1" {
		t.Fatalf("restored cluster id %q", got)
	}
	if !bytes.Equal(snapshotBytes(t, g), snap) {
		t.Fatal("the restored state snapshots to other bytes")
	}
	if r := h.one(&fsm.ClusterID{ID: "c-2"}); r.Err == nil {
		t.Fatal("a second cluster id was accepted")
	}
	if r := h.one(&fsm.ClusterID{ID: "c-1"}); r.Err != nil {
		t.Fatalf("the same cluster id again: %v", r.Err)
	}
	if got := h.f.ClusterID(); got != "c-1" {
		t.Fatalf("cluster id %q after a refused change", got)
	}

	// Through the log codec, alone and in a batch.
	for _, c := range []fsm.Command{&fsm.ClusterID{ID: "c-9"}, &fsm.Batch{Commands: []fsm.Command{&fsm.ClusterID{ID: "c-9"}}}} {
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
		if id, ok := d.(*fsm.ClusterID); !ok || id.ID != "c-9" {
			t.Fatalf("decoded %#v", d)
		}
	}

	// With members; and a snapshot of a state without an id restores over
	// one with an id to none.
	m := memberState(t)
	plain := snapshotBytes(t, m.f)
	m.one(&fsm.ClusterID{ID: "c-3"})
	withID := snapshotBytes(t, m.f)
	g = fsm.New()
	if err := g.Restore(bytes.NewReader(withID)); err != nil {
		t.Fatal(err)
	}
	if g.ClusterID() != "c-3" || len(g.Members()) != 3 {
		t.Fatalf("restored %q %+v", g.ClusterID(), g.Members())
	}
	if err := g.Restore(bytes.NewReader(plain)); err != nil {
		t.Fatal(err)
	}
	if g.ClusterID() != "" {
		t.Fatalf("an old snapshot restored cluster id %q", g.ClusterID())
	}
}
