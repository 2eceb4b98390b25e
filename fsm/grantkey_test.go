package fsm_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func gkey(b byte) fsm.GrantKey {
	var k fsm.GrantKey
	for i := range k {
		k[i] = b
	}
	return k
}

// keysOf returns the grant keys of server id (nil if none).
func keysOf(t *testing.T, f *fsm.FSM, id string) *fsm.GrantKeys {
	t.Helper()
	m, ok := f.Member(id)
	if !ok {
		t.Fatalf("no member %s", id)
	}
	return m.GrantKeys
}

// TestMemberKey: a MemberKey makes a key the server's current one and
// retires the one it replaces at the current tick; recording the current
// key again changes nothing; a retired key recorded again leaves the retired
// list; at most MaxRetiredGrantKeys are kept; a tombstone or another
// incarnation retires the current key, a Member of the same incarnation
// keeps it; bad commands are refused and change nothing.
func TestMemberKey(t *testing.T) {
	h := newHarness(t)
	h.tick(3)
	h.one(&fsm.Member{ID: "n1", Incarnation: "inc-a"})
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b"})
	if keysOf(t, h.f, "n1") != nil {
		t.Fatal("a new member has grant keys")
	}
	idx := h.index
	if r := h.one(&fsm.MemberKey{ID: "n1", Key: gkey(1)}); r.Err != nil || len(h.events) != 0 {
		t.Fatalf("member key: %+v, events %v", r, h.events)
	}
	want := &fsm.GrantKeys{Current: gkey(1)}
	if got := keysOf(t, h.f, "n1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %+v, want %+v", got, want)
	}
	if m, _ := h.f.Member("n1"); m.Index != idx-1 || m.Incarnation != "inc-a" {
		t.Fatalf("the key changed the record's index or incarnation: %+v", m)
	}
	// Again: no change (the same pointer).
	before := keysOf(t, h.f, "n1")
	if r := h.one(&fsm.MemberKey{ID: "n1", Key: gkey(1)}); r.Err != nil || keysOf(t, h.f, "n1") != before {
		t.Fatalf("recording the current key again: %+v, keys %+v", r.Err, keysOf(t, h.f, "n1"))
	}
	// A rotation retires the old key at the current tick.
	h.tick(2) // tick 5
	h.one(&fsm.MemberKey{ID: "n1", Key: gkey(2)})
	want = &fsm.GrantKeys{Current: gkey(2), Retired: []fsm.RetiredGrantKey{{Key: gkey(1), Tick: 5}}}
	if got := keysOf(t, h.f, "n1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a rotation %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(before, &fsm.GrantKeys{Current: gkey(1)}) {
		t.Fatalf("a rotation changed the earlier value in place: %+v", before)
	}
	// Back to the retired key: it leaves the retired list.
	h.tick(1)
	h.one(&fsm.MemberKey{ID: "n1", Key: gkey(1)})
	want = &fsm.GrantKeys{Current: gkey(1), Retired: []fsm.RetiredGrantKey{{Key: gkey(2), Tick: 6}}}
	if got := keysOf(t, h.f, "n1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("back to a retired key %+v, want %+v", got, want)
	}
	// Bounded: the oldest retired keys go.
	for b := byte(3); b <= 8; b++ {
		h.tick(1)
		h.one(&fsm.MemberKey{ID: "n1", Key: gkey(b)})
	}
	got := keysOf(t, h.f, "n1")
	if got.Current != gkey(8) || len(got.Retired) != fsm.MaxRetiredGrantKeys {
		t.Fatalf("after many rotations %+v", got)
	}
	for i, r := range got.Retired {
		if r.Key != gkey(byte(7-i)) || r.Tick != h.f.Tick()-uint64(i) {
			t.Fatalf("retired %d: %+v (tick now %d)", i, r, h.f.Tick())
		}
	}

	// n2: a Member of the same incarnation keeps its key; a tombstone
	// retires it; the tombstoned server takes no key; re-added under a new
	// incarnation it has only the retired key until its new one is
	// recorded.
	h.one(&fsm.MemberKey{ID: "n2", Key: gkey(20)})
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b"})
	if got := keysOf(t, h.f, "n2"); !reflect.DeepEqual(got, &fsm.GrantKeys{Current: gkey(20)}) {
		t.Fatalf("a Member of the same incarnation changed the keys: %+v", got)
	}
	h.tick(1)
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b", Removed: true})
	removedAt := h.f.Tick()
	want = &fsm.GrantKeys{Retired: []fsm.RetiredGrantKey{{Key: gkey(20), Tick: removedAt}}}
	if got := keysOf(t, h.f, "n2"); !reflect.DeepEqual(got, want) {
		t.Fatalf("tombstoned: %+v, want %+v", got, want)
	}
	if r := h.one(&fsm.MemberKey{ID: "n2", Key: gkey(21)}); code(r.Err) != wire.CodeInvalidArgument || r.Err.Field != "id" {
		t.Fatalf("a key for a tombstone: %+v", r.Err)
	}
	h.tick(1)
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-c"})
	if got := keysOf(t, h.f, "n2"); !reflect.DeepEqual(got, want) {
		t.Fatalf("re-added: %+v, want %+v", got, want)
	}
	h.one(&fsm.MemberKey{ID: "n2", Key: gkey(22)})
	want = &fsm.GrantKeys{Current: gkey(22), Retired: want.Retired}
	if got := keysOf(t, h.f, "n2"); !reflect.DeepEqual(got, want) {
		t.Fatalf("re-added with a key: %+v, want %+v", got, want)
	}
	// Another incarnation without a tombstone (a wiped data directory)
	// retires the key too.
	h.tick(1)
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-d"})
	if got := keysOf(t, h.f, "n2"); !got.Current.IsZero() || got.Retired[0] != (fsm.RetiredGrantKey{Key: gkey(22), Tick: h.f.Tick()}) {
		t.Fatalf("another incarnation: %+v", got)
	}

	// Refused, changing nothing (alone and inside a batch).
	members := h.f.Members()
	snap := snapshotBytes(t, h.f)
	for _, c := range []*fsm.MemberKey{
		{ID: "", Key: gkey(9)},
		{ID: strings.Repeat("n", fsm.MaxServerIDBytes+1), Key: gkey(9)},
		{ID: "n\x01", Key: gkey(9)},
		{ID: "n1"},
		{ID: "n7", Key: gkey(9)},
	} {
		r := h.one(c)
		want := wire.CodeInvalidArgument
		if c.ID == "n7" {
			want = wire.CodeNotFound
		}
		if code(r.Err) != want {
			t.Fatalf("%+v: %+v, want %s", c, r.Err, want)
		}
	}
	res := h.apply(&fsm.Batch{Commands: []fsm.Command{&fsm.MemberKey{ID: "n7", Key: gkey(9)}, &fsm.MemberKey{ID: "n1"}}})
	if code(res[0].Err) != wire.CodeNotFound || code(res[1].Err) != wire.CodeInvalidArgument {
		t.Fatalf("batch: %+v", res)
	}
	if got := h.f.Members(); !reflect.DeepEqual(got, members) {
		t.Fatalf("refused commands changed the registry:\n%+v\n%+v", got, members)
	}
	if after := snapshotBytes(t, h.f); !bytesEqualButIndex(snap, after) {
		t.Fatal("refused commands changed the snapshot beyond the index")
	}
}

// bytesEqualButIndex compares two snapshots of the same state taken at
// different indexes: their lengths match and they differ in at most the
// header's index bytes.
func bytesEqualButIndex(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	diff := 0
	for i := range a {
		if a[i] != b[i] {
			diff++
		}
	}
	return diff <= 2
}

// TestMemberKeyCodec: the entry's exact bytes, a round trip alone and in a
// batch, and refusals: a truncated key, trailing bytes, an entry of version
// 3 and a version-1 (JSON) entry of the type.
func TestMemberKeyCodec(t *testing.T) {
	c := &fsm.MemberKey{ID: "n1", Key: gkey(0xab)}
	b := mustEncode(t, c)
	want := "0416" + "026e31" + strings.Repeat("ab", 32)
	if got := hex.EncodeToString(b); got != want {
		t.Fatalf("encoding %s, want %s", got, want)
	}
	for _, cmd := range []fsm.Command{c, &fsm.Batch{Commands: []fsm.Command{c, &fsm.Member{ID: "n2"}}}} {
		d := roundTrip(t, cmd)
		if bt, ok := d.(*fsm.Batch); ok {
			d = bt.Commands[0]
		}
		if !reflect.DeepEqual(d, c) {
			t.Fatalf("decoded %#v", d)
		}
	}
	checked, err := fsm.EncodeChecked(c)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := fsm.Decode(checked); err != nil || !reflect.DeepEqual(d, c) {
		t.Fatalf("checked entry: %#v, %v", d, err)
	}
	for i := range len(b) {
		if d, err := fsm.Decode(b[:i:i]); err == nil {
			t.Errorf("prefix of %d bytes decoded as %#v", i, d)
		}
	}
	for i := range b {
		m := bytes.Clone(b)
		m[i] ^= 0x80
		if d, err := fsm.Decode(m); err == nil && !bytes.Equal(mustEncode(t, d), m) {
			t.Errorf("byte %d flipped: decodes, but encodes otherwise", i)
		}
	}
	for name, bad := range map[string][]byte{
		"truncated": b[:len(b)-1],
		"trailing":  append(append([]byte(nil), b...), 0),
		"version 3": append([]byte{3}, b[1:]...),
		"json":      append([]byte{1, 22}, []byte(`{"id":"n1","key":[]}`)...),
	} {
		if d, err := fsm.Decode(bad); err == nil {
			t.Errorf("%s: decoded %#v", name, d)
		}
	}
}

// snapRecords splits a format-2 snapshot into its records (after the
// magic).
func snapRecords(t *testing.T, snap []byte) [][]byte {
	t.Helper()
	rest := snap[len("LHSNAP"):]
	var out [][]byte
	for len(rest) > 0 {
		n, w := binary.Uvarint(rest)
		if w <= 0 || int(n) > len(rest)-w {
			t.Fatal("bad record framing")
		}
		out = append(out, rest[w:w+int(n)])
		rest = rest[w+int(n):]
	}
	return out
}

func joinRecords(recs [][]byte) []byte {
	out := []byte("LHSNAP")
	for _, r := range recs {
		out = binary.AppendUvarint(out, uint64(len(r)))
		out = append(out, r...)
	}
	return out
}

// TestGrantKeysSnapshot: member records with keys survive a snapshot byte
// for byte; a record without keys is written exactly as before keys
// existed; a rebase keeps the running state's keys; malformed key fields
// are refused.
func TestGrantKeysSnapshot(t *testing.T) {
	h := newHarness(t)
	h.tick(2)
	h.one(&fsm.Member{ID: "n1", Incarnation: "a"})
	h.one(&fsm.Member{ID: "n2", Incarnation: "b"})
	plain := snapshotBytes(t, h.f)
	recs := snapRecords(t, plain)
	// id, incarnation, removed, index: nothing after.
	if got, want := hex.EncodeToString(recs[len(recs)-1]), "026e32"+"0162"+"00"+"04"; got != want {
		t.Fatalf("a member without keys is written %s, want %s", got, want)
	}
	h.one(&fsm.MemberKey{ID: "n1", Key: gkey(1)})
	h.tick(1)
	h.one(&fsm.MemberKey{ID: "n1", Key: gkey(2)})
	h.one(&fsm.MemberKey{ID: "n2", Key: gkey(3)})
	h.one(&fsm.Member{ID: "n2", Incarnation: "b", Removed: true})
	snap := snapshotBytes(t, h.f)
	g := fsm.New()
	if err := g.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Members(), h.f.Members()) || !bytes.Equal(snapshotBytes(t, g), snap) {
		t.Fatalf("restored members %+v, want %+v", g.Members(), h.f.Members())
	}
	// A rebase (a backup restored over the running state) keeps the
	// running registry, keys included.
	old := fsm.New()
	if err := old.Restore(bytes.NewReader(plain)); err != nil {
		t.Fatal(err)
	}
	old.Rebase(h.f, h.f.Index()+1)
	if !reflect.DeepEqual(old.Members(), h.f.Members()) {
		t.Fatalf("rebased members %+v, want %+v", old.Members(), h.f.Members())
	}

	recs = snapRecords(t, snap)
	n1 := len(recs) - 2 // n1's record; n2's is last
	base := recs[n1][:len("\x02n1\x01a\x00")+1]
	if !bytes.Equal(base[:5], []byte("\x02n1\x01a")) {
		t.Fatalf("unexpected record layout %x", recs[n1])
	}
	cur := bytes.Repeat([]byte{7}, 32)
	zero := make([]byte, 32)
	for name, tail := range map[string][]byte{
		"no key at all":      append(append([]byte(nil), zero...), 0),
		"truncated key":      cur[:31],
		"no retired count":   cur,
		"too many retired":   append(append([]byte(nil), cur...), 5),
		"zero retired key":   append(append(append([]byte(nil), cur...), 1), append(append([]byte(nil), zero...), 3)...),
		"retired count past": append(append([]byte(nil), cur...), 2, 1),
		"trailing":           append(append(append([]byte(nil), cur...), 0), 0),
	} {
		bad := append([][]byte(nil), recs...)
		bad[n1] = append(append([]byte(nil), base...), tail...)
		if err := fsm.New().Restore(bytes.NewReader(joinRecords(bad))); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
	// The layout the test builds on is right: a current key and no
	// retired keys restores.
	good := append([][]byte(nil), recs...)
	good[n1] = append(append(append([]byte(nil), base...), cur...), 0)
	f := fsm.New()
	if err := f.Restore(bytes.NewReader(joinRecords(good))); err != nil {
		t.Fatal(err)
	}
	if k := keysOf(t, f, "n1"); k.Current != gkey(7) || k.Retired != nil {
		t.Fatalf("crafted record restored as %+v", k)
	}
}
