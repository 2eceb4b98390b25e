package node

import (
	"reflect"
	"testing"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// TestFeatureFlagsReadTheirOwnGossipField ties each recorded feature to
// the gossip flag of the entries it switches on: a feature checked against
// another feature's flag would have the leader write entries an older
// server cannot decode. It also checks that this server announces every
// flag, and that every feature bit is in featureFlags once.
func TestFeatureFlagsReadTheirOwnGossipField(t *testing.T) {
	want := map[fsm.Features]string{
		fsm.FeatureEntryCRC:      "EntryCRC",
		fsm.FeatureChunkedExpiry: "ChunkedExpiry",
		fsm.FeatureRestoreLog:    "RestoreLog",
		fsm.FeatureRestoreBounds: "RestoreBounds",
		fsm.FeatureChunkedPrune:  "ChunkedPrune",
	}
	metaType := reflect.TypeFor[cluster.Meta]()
	var bools []string
	for i := range metaType.NumField() {
		if metaType.Field(i).Type.Kind() == reflect.Bool {
			bools = append(bools, metaType.Field(i).Name)
		}
	}
	peer := func(set func(name string) bool) cluster.Peer {
		var p cluster.Peer
		v := reflect.ValueOf(&p.Meta).Elem()
		for _, name := range bools {
			v.FieldByName(name).SetBool(set(name))
		}
		return p
	}
	seen := map[fsm.Features]bool{}
	for _, f := range featureFlags {
		field, ok := want[f.bit]
		if !ok {
			t.Fatalf("featureFlags has feature %#x, which this test does not know: add it to want", uint64(f.bit))
		}
		if seen[f.bit] {
			t.Fatalf("featureFlags lists %s twice", field)
		}
		seen[f.bit] = true
		if _, ok := metaType.FieldByName(field); !ok {
			t.Fatalf("cluster.Meta has no field %s", field)
		}
		if f.has(peer(func(name string) bool { return name != field })) {
			t.Errorf("%s: a peer announcing every flag but %s counts as reading the feature", field, field)
		}
		if !f.has(peer(func(name string) bool { return name == field })) {
			t.Errorf("%s: a peer announcing only %s does not count as reading the feature", field, field)
		}
	}
	for bit, field := range want {
		if !seen[bit] {
			t.Errorf("feature %s is not in featureFlags", field)
		}
	}
	// Every bit below the highest known one is a feature of this table.
	var all fsm.Features
	for bit := range want {
		all |= bit
	}
	if all&(all+1) != 0 {
		t.Errorf("the known features %#b leave a gap: a feature bit is missing from the table", uint64(all))
	}
	// This server announces each flag.
	n := &Node{gk: &grantKeys{}}
	meta := reflect.ValueOf(n.gossipMeta())
	for _, field := range want {
		if !meta.FieldByName(field).Bool() {
			t.Errorf("gossipMeta does not announce %s", field)
		}
	}
}
