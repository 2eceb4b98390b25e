package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// TestFeatures: recorded features only grow (a later command adds bits,
// none removes them); they survive the log codec and a snapshot, alone
// (without a cluster id or seal check before them in the header) and
// with both; a restore from a file keeps the running state's; a state
// prepared for the previous release has none.
func TestFeatures(t *testing.T) {
	h := newHarness(t)
	if got := h.f.Features(); got != 0 {
		t.Fatalf("new state has features %b", got)
	}
	plain := snapshotBytes(t, h.f)
	for _, c := range []fsm.Command{&fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC}, &fsm.Batch{Commands: []fsm.Command{&fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC}}}} {
		b, err := fsm.EncodeChecked(c)
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
		if fc, ok := d.(*fsm.FeaturesCmd); !ok || fc.Features != fsm.FeatureEntryCRC {
			t.Fatalf("decoded %#v", d)
		}
	}
	if r := h.one(&fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC | fsm.FeatureRestoreLog}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := h.one(&fsm.FeaturesCmd{Features: fsm.FeatureChunkedExpiry}); r.Err != nil {
		t.Fatal(r.Err)
	}
	h.one(&fsm.FeaturesCmd{})
	all := fsm.FeatureEntryCRC | fsm.FeatureRestoreLog | fsm.FeatureChunkedExpiry
	if got := h.f.Features(); got != all {
		t.Fatalf("features %b, want %b", got, all)
	}

	roundTrip := func(f *fsm.FSM, want fsm.Features) *fsm.FSM {
		t.Helper()
		snap := snapshotBytes(t, f)
		g := fsm.New()
		if err := g.Restore(bytes.NewReader(snap)); err != nil {
			t.Fatal(err)
		}
		if got := g.Features(); got != want {
			t.Fatalf("restored features %b, want %b", got, want)
		}
		if !bytes.Equal(snapshotBytes(t, g), snap) {
			t.Fatal("the restored state snapshots to other bytes")
		}
		return g
	}
	roundTrip(h.f, all)
	h.one(&fsm.ClusterID{ID: "c-1"})
	h.one(&fsm.SealCheck{Check: []byte("check-1")})
	g := roundTrip(h.f, all)
	if g.ClusterID() != "c-1" || string(g.SealCheck()) != "check-1" {
		t.Fatalf("restored id %q check %q", g.ClusterID(), g.SealCheck())
	}

	// A file without features restored into this state keeps this
	// state's; a file with features into a state without keeps none.
	file := fsm.New()
	if err := file.Restore(bytes.NewReader(plain)); err != nil {
		t.Fatal(err)
	}
	file.Rebase(h.f, h.f.Index()+1)
	if got := file.Features(); got != all {
		t.Fatalf("features after a restore: %b, want %b", got, all)
	}
	empty := fsm.New()
	g.Rebase(empty, 10)
	if got := g.Features(); got != 0 {
		t.Fatalf("features after a restore into a cluster without: %b", got)
	}

	if _, err := h.f.ForPreviousRelease(); err != nil {
		t.Fatal(err)
	}
	if got := h.f.Features(); got != 0 {
		t.Fatalf("features %b for the previous release", got)
	}
}
