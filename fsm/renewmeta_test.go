package fsm_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func renewMeta(id string, m map[string]string) *fsm.Renew {
	r := renew(id)
	r.Metadata, r.SetMetadata = m, true
	return r
}

// tooLarge are metadata past the limits: too many entries, too many bytes.
func tooLarge() map[string]map[string]string {
	many := map[string]string{}
	for i := range fsm.MaxMetaEntries + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	return map[string]map[string]string{
		"entries":   many,
		"bytes":     {"big": strings.Repeat("v", fsm.MaxMetaBytes)},
		"empty key": {"": "v"},
	}
}

// TestRenewMetadata: a renewal that carries metadata replaces the lease's
// metadata with the renewal, and the renewed event carries the new
// metadata; without metadata it stays; empty metadata clears it; metadata
// past its limits, or a renewal that fails, changes nothing.
func TestRenewMetadata(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	a := acq("L1", "k", "w1", 5)
	a.Metadata = map[string]string{"shard": "3"}
	wantCode(t, "acquire", h.one(a).Err, "")

	res := h.one(renewMeta("L1", map[string]string{"processed": "120", "errors": "0"}))
	wantCode(t, "renew with metadata", res.Err, "")
	want := map[string]string{"processed": "120", "errors": "0"}
	if got := h.f.Lease("L1").Metadata(); !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata after renew: %v, want %v (replaced, not merged)", got, want)
	}
	if !reflect.DeepEqual(res.Lease.Metadata(), want) || res.Lease.RenewalCount != 1 {
		t.Fatalf("result lease: %+v", res.Lease)
	}
	ev := h.eventsOf(fsm.EventRenewed)
	if len(ev) != 1 || !reflect.DeepEqual(ev[0].Lease.Metadata(), want) {
		t.Fatalf("renewed events: %+v", ev)
	}

	wantCode(t, "plain renew", h.one(renew("L1")).Err, "")
	if got := h.f.Lease("L1").Metadata(); !reflect.DeepEqual(got, want) {
		t.Fatalf("a renewal without metadata changed it: %v", got)
	}

	for name, m := range tooLarge() {
		before := jsonOf(t, h.f.Lease("L1"))
		res := h.one(renewMeta("L1", m))
		wantCode(t, name, res.Err, wire.CodeInvalidArgument)
		if res.Err.Field != "metadata" {
			t.Fatalf("%s: field %q, want metadata", name, res.Err.Field)
		}
		if len(h.events) != 0 {
			t.Fatalf("%s: events %v", name, h.events)
		}
		if after := jsonOf(t, h.f.Lease("L1")); after != before {
			t.Fatalf("%s: refused renewal changed the lease:\n%s\n%s", name, before, after)
		}
	}

	// A renewal that fails (wrong token) changes no metadata.
	bad := renewMeta("L1", map[string]string{"x": "y"})
	bad.TokenHash = badTok
	wantCode(t, "wrong token", h.one(bad).Err, wire.CodeLeaseTokenInvalid)
	if got := h.f.Lease("L1").Metadata(); !reflect.DeepEqual(got, want) {
		t.Fatalf("a refused renewal changed metadata: %v", got)
	}

	// Empty metadata clears it.
	wantCode(t, "clear", h.one(renewMeta("L1", map[string]string{})).Err, "")
	if got := h.f.Lease("L1").Metadata(); got != nil {
		t.Fatalf("metadata after clearing: %#v", got)
	}

	// With a new TTL too.
	r := renewMeta("L1", map[string]string{"a": "b"})
	r.TTLTicks, r.TTLMS = 9, 9*periodMS
	wantCode(t, "ttl and metadata", h.one(r).Err, "")
	if l := h.f.Lease("L1"); l.TTLTicks != 9 || l.Metadata()["a"] != "b" {
		t.Fatalf("lease after ttl and metadata: %+v", l)
	}
}

// TestRenewMetadataBound: a lease bound to a session takes metadata from a
// renewal (its expiry stays its session's); without metadata, or with a
// TTL, the renewal is refused as before.
func TestRenewMetadataBound(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	wantCode(t, "session", h.one(session("S1", "w1", 5)).Err, "")
	b := bound("L1", "k", "S1")
	b.Metadata = map[string]string{"value": "old"}
	wantCode(t, "bound acquire", h.one(b).Err, "")
	expires := h.f.Lease("L1").ExpiresTick

	wantCode(t, "bound plain renew", h.one(renew("L1")).Err, wire.CodeInvalidArgument)
	r := renewMeta("L1", map[string]string{"value": "x"})
	r.TTLTicks, r.TTLMS = 9, 9*periodMS
	wantCode(t, "bound renew with ttl", h.one(r).Err, wire.CodeInvalidArgument)
	if got := h.f.Lease("L1").Metadata()["value"]; got != "old" {
		t.Fatalf("refused renewals changed metadata: %q", got)
	}

	wantCode(t, "bound renew with metadata", h.one(renewMeta("L1", map[string]string{"value": "new"})).Err, "")
	l := h.f.Lease("L1")
	if l.Metadata()["value"] != "new" || l.ExpiresTick != expires || l.SessionID != "S1" {
		t.Fatalf("bound lease after renewal: %+v (expires %d before)", l, expires)
	}
	if ev := h.eventsOf(fsm.EventRenewed); len(ev) != 1 || ev[0].Lease.Metadata()["value"] != "new" {
		t.Fatalf("renewed events: %+v", ev)
	}
}

// TestHeartbeatMetadata: each item of a bulk heartbeat may carry its own
// metadata; an item past the limits fails alone and changes nothing.
func TestHeartbeatMetadata(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	for _, id := range []string{"L1", "L2", "L3"} {
		a := acq(id, "k"+id, "w1", 5)
		a.Metadata = map[string]string{"was": id}
		wantCode(t, "acquire "+id, h.one(a).Err, "")
	}
	hb := &fsm.Heartbeat{WallMS: 9, Items: []fsm.HeartbeatItem{
		{LeaseID: "L1", TokenHash: tok("L1"), Metadata: map[string]string{"processed": "7"}, SetMetadata: true},
		{LeaseID: "L2", TokenHash: tok("L2")},
		{LeaseID: "L3", TokenHash: tok("L3"), Metadata: tooLarge()["entries"], SetMetadata: true},
	}}
	if hb.Type() != fsm.TypeHeartbeatMeta {
		t.Fatalf("type %d", hb.Type())
	}
	res := h.one(hb)
	if res.Err != nil || len(res.Items) != 3 {
		t.Fatalf("heartbeat: %+v", res)
	}
	wantCode(t, "L1", res.Items[0].Err, "")
	wantCode(t, "L2", res.Items[1].Err, "")
	wantCode(t, "L3", res.Items[2].Err, wire.CodeInvalidArgument)
	if m := h.f.Lease("L1").Metadata(); !reflect.DeepEqual(m, map[string]string{"processed": "7"}) {
		t.Fatalf("L1 metadata %v", m)
	}
	if m := h.f.Lease("L2").Metadata(); m["was"] != "L2" {
		t.Fatalf("L2 metadata %v", m)
	}
	if l := h.f.Lease("L3"); l.Metadata()["was"] != "L3" || l.RenewalCount != 0 {
		t.Fatalf("L3 changed: %+v", l)
	}
}

// TestRenewMetadataReplicas: two replicas applying the same log of
// metadata renewals (encoded, decoded) hold identical states.
func TestRenewMetadataReplicas(t *testing.T) {
	var log [][]byte
	add := func(c fsm.Command) { log = append(log, mustEncode(t, c)) }
	add(&fsm.Tick{Tick: 1, WallMS: 1000, PeriodMS: periodMS, RetainTicks: 10})
	add(acq("L1", "k1", "w1", 5))
	add(acq("L2", "k2", "w1", 5))
	add(session("S1", "w2", 5))
	add(bound("L3", "k3", "S1"))
	for i := range 20 {
		m := map[string]string{"n": fmt.Sprint(i), fmt.Sprint("k", i%3): strings.Repeat("x", i)}
		add(renewMeta([]string{"L1", "L2", "L3"}[i%3], m))
		hb := &fsm.Heartbeat{WallMS: int64(i), Items: []fsm.HeartbeatItem{
			{LeaseID: "L1", TokenHash: tok("L1")},
			{LeaseID: "L2", TokenHash: tok("L2")},
		}}
		if i%2 == 0 {
			hb.Items[0].Metadata, hb.Items[0].SetMetadata = m, true
		}
		if i%5 == 0 {
			hb.Items[1].Metadata, hb.Items[1].SetMetadata = map[string]string{}, true
		}
		add(hb)
	}
	a, b := newReplica(t), newReplica(t)
	for i, e := range log {
		a.apply(uint64(i+1), e)
		b.apply(uint64(i+1), e)
		if a.trace[uint64(i+1)] != b.trace[uint64(i+1)] {
			t.Fatalf("entry %d: replicas disagree", i+1)
		}
	}
	if sa, sb := snapshotBytes(t, a.f), snapshotBytes(t, b.f); !bytes.Equal(sa, sb) {
		t.Fatal("snapshots differ")
	}
	if m := a.f.Lease("L3").Metadata(); m["n"] != "17" {
		t.Fatalf("L3 metadata %v", m)
	}
	if m := a.f.Lease("L2").Metadata(); m["n"] != "19" {
		t.Fatalf("L2 metadata %v", m)
	}
}

// TestRenewMetaEncoding pins the entries of the metadata renewals and
// checks what Decode refuses of them.
func TestRenewMetaEncoding(t *testing.T) {
	zero := strings.Repeat("00", 32)
	for _, tc := range []struct {
		c   fsm.Command
		hex string
	}{
		// A plain renew keeps its type and body.
		{&fsm.Renew{LeaseID: "L", WallMS: 2}, "0404" + "014c" + zero + "00" + "00" + "04"},
		{&fsm.Renew{LeaseID: "L", WallMS: 2, SetMetadata: true, Metadata: map[string]string{"a": "1"}},
			"0414" + "014c" + zero + "00" + "00" + "04" + "01" + "0161" + "0131"},
		{&fsm.Renew{LeaseID: "L", WallMS: 2, SetMetadata: true}, "0414" + "014c" + zero + "00" + "00" + "04" + "00"},
		{&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "a"}}, WallMS: 64}, "0407" + "01" + "0161" + zero + "8001"},
		{&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "a"}, {LeaseID: "b", SetMetadata: true, Metadata: map[string]string{"a": "1"}}}, WallMS: 64},
			"0415" + "02" + "0161" + zero + "00" + "00" + "0162" + zero + "01" + "01" + "0161" + "0131" + "8001"},
	} {
		b := mustEncode(t, tc.c)
		if got := hex.EncodeToString(b); got != tc.hex {
			t.Errorf("%+v:\n got %s\nwant %s", tc.c, got, tc.hex)
		}
		d, err := fsm.Decode(b)
		if err != nil || !reflect.DeepEqual(d, tc.c) {
			t.Errorf("% x decodes as %+v, %v", b, d, err)
		}
		// With a checksum too.
		cb, err := fsm.EncodeChecked(tc.c)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := fsm.Decode(cb); err != nil || !reflect.DeepEqual(d, tc.c) {
			t.Errorf("checked % x decodes as %+v, %v", cb, d, err)
		}
		// Entries of earlier versions never carry the new types.
		if b[1] == byte(fsm.TypeRenewMeta) || b[1] == byte(fsm.TypeHeartbeatMeta) {
			for _, v := range []byte{2, 3} {
				old := append([]byte{v}, b[1:]...)
				if d, err := fsm.Decode(old); err == nil {
					t.Errorf("version %d % x decoded as %+v", v, old, d)
				}
			}
		}
	}

	hexb := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, s := range map[string]string{
		"heartbeat meta, no item sets": "0415" + "01" + "0161" + zero + "00" + "00" + "8001",
		"item map without flag":        "0415" + "02" + "0161" + zero + "00" + "01" + "0161" + "0131" + "0162" + zero + "01" + "00" + "8001",
		"item flag 2":                  "0415" + "01" + "0161" + zero + "02" + "00" + "8001",
		"renew meta without map":       "0414" + "014c" + zero + "00" + "00" + "04",
		"renew meta trailing":          "0414" + "014c" + zero + "00" + "00" + "04" + "00" + "00",
	} {
		if d, err := fsm.Decode(hexb(s)); err == nil {
			t.Errorf("%s: decoded as %+v", name, d)
		}
	}
	// Version-1 (JSON) entries predate metadata renewals.
	for name, b := range map[string][]byte{
		"renew":     append([]byte{versionJSON, byte(fsm.TypeRenew)}, `{"lease_id":"L","token_hash":"`+zero+`","wall_ms":1,"set_metadata":true}`...),
		"heartbeat": append([]byte{versionJSON, byte(fsm.TypeHeartbeat)}, `{"items":[{"lease_id":"L","token_hash":"`+zero+`","metadata":{"a":"1"}}],"wall_ms":1}`...),
		"type 20":   append([]byte{versionJSON, byte(fsm.TypeRenewMeta)}, `{"lease_id":"L","token_hash":"`+zero+`","wall_ms":1}`...),
	} {
		if d, err := fsm.Decode(b); err == nil {
			t.Errorf("version 1 %s decoded as %+v", name, d)
		}
	}
	// Metadata without the flag is not written (it would be lost).
	if _, err := fsm.Encode(&fsm.Renew{LeaseID: "L", Metadata: map[string]string{"a": "1"}}); err == nil {
		t.Error("renew metadata without SetMetadata encoded")
	}
	if _, err := fsm.Encode(&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "L", Metadata: map[string]string{"a": "1"}}}}); err == nil {
		t.Error("heartbeat metadata without SetMetadata encoded")
	}
}

// metaCommands are metadata renewals of every form, and a batch of them.
func metaCommands() []fsm.Command {
	cmds := []fsm.Command{
		renewMeta("L1", map[string]string{"processed": "12", "ünï": "cödé"}),
		renewMeta("L1", nil),
		&fsm.Heartbeat{WallMS: 8, Items: []fsm.HeartbeatItem{
			{LeaseID: "L1", TokenHash: tok("L1"), Metadata: map[string]string{"a": "1", "b": "2"}, SetMetadata: true},
			{LeaseID: "L2", TokenHash: tok("L2")},
			{LeaseID: "L3", TokenHash: tok("L3"), SetMetadata: true},
		}},
	}
	batch := &fsm.Batch{Commands: append([]fsm.Command{renew("L0")}, cmds...)}
	return append(cmds, batch)
}

// TestRenewMetaCanonical: every proper prefix of a metadata renewal is
// refused, and a corrupted byte either is refused or yields a command whose
// encoding is exactly the input (one encoding per command).
func TestRenewMetaCanonical(t *testing.T) {
	for _, c := range metaCommands() {
		b := mustEncode(t, c)
		if d, err := fsm.Decode(b); err != nil || !bytes.Equal(mustEncode(t, d), b) {
			t.Fatalf("%T: round trip: %v", c, err)
		}
		for i := range len(b) {
			if d, err := fsm.Decode(b[:i:i]); err == nil || d != nil {
				t.Errorf("%T: prefix of %d of %d bytes decoded as %#v (err %v)", c, i, len(b), d, err)
			}
		}
		for i := range b {
			for _, x := range []byte{0x01, 0x80, 0xff} {
				m := bytes.Clone(b)
				m[i] ^= x
				d, err := fsm.Decode(m)
				if err != nil || m[0] != fsm.Version {
					continue
				}
				if e := mustEncode(t, d); !bytes.Equal(e, m) {
					t.Errorf("%T with byte %d ^ %#x: decodes, but encodes as\n% x\nnot\n% x", c, i, x, e, m)
				}
			}
		}
	}
}
