package fsm_test

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestMember: the member registry records, overwrites and tombstones
// servers, standalone and inside a batch, refuses bad ids and incarnations
// without changing anything, and touches nothing else.
func TestMember(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("L1", "k", "alice", 10))
	before := func() (uint64, uint64, *fsm.Lease) { return h.f.Tick(), h.f.Fence(), h.f.Lease("L1") }
	tick0, fence0, lease0 := before()

	if _, ok := h.f.Member("n1"); ok || len(h.f.Members()) != 0 {
		t.Fatalf("a new state machine has members: %v", h.f.Members())
	}
	r := h.one(&fsm.Member{ID: "n1", Incarnation: "inc-a"})
	if r.Err != nil || r.Lease != nil || r.Session != nil || len(h.events) != 0 || len(h.notices) != 0 {
		t.Fatalf("member: result %+v, events %v, notices %v", r, h.events, h.notices)
	}
	want1 := fsm.MemberRecord{ID: "n1", Incarnation: "inc-a", Index: h.index}
	if m, ok := h.f.Member("n1"); !ok || m != want1 {
		t.Fatalf("Member(n1) = %+v %v, want %+v", m, ok, want1)
	}

	// A later Member overwrites; a tombstone is a record like any other.
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b"})
	h.one(&fsm.Member{ID: "n1", Incarnation: "inc-c"})
	want1 = fsm.MemberRecord{ID: "n1", Incarnation: "inc-c", Index: h.index}
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b", Removed: true})
	want2 := fsm.MemberRecord{ID: "n2", Incarnation: "inc-b", Removed: true, Index: h.index}
	if got := h.f.Members(); !reflect.DeepEqual(got, []fsm.MemberRecord{want1, want2}) {
		t.Fatalf("Members() = %+v", got)
	}
	// Members returns a copy.
	h.f.Members()[0].Incarnation = "changed"
	if m, _ := h.f.Member("n1"); m != want1 {
		t.Fatalf("changing what Members returned changed the registry: %+v", m)
	}

	// Inside a batch: each command gets its own result, and the records the
	// batch's index.
	res := h.apply(&fsm.Batch{Commands: []fsm.Command{
		&fsm.Member{ID: "n3", Incarnation: "inc-d"},
		renew("L1"),
		&fsm.Member{ID: "", Incarnation: "x"},
		&fsm.Member{ID: "n0", Removed: true},
	}})
	if len(res) != 4 || res[0].Err != nil || res[1].Err != nil || res[1].Lease == nil || code(res[2].Err) != wire.CodeInvalidArgument || res[3].Err != nil {
		t.Fatalf("batch results %+v", res)
	}
	if len(h.events) != 1 || h.events[0].Type != fsm.EventRenewed || h.events[0].Seq != 0 {
		t.Fatalf("batch events %+v", h.events)
	}
	want0 := fsm.MemberRecord{ID: "n0", Removed: true, Index: h.index}
	want3 := fsm.MemberRecord{ID: "n3", Incarnation: "inc-d", Index: h.index}
	if got := h.f.Members(); !reflect.DeepEqual(got, []fsm.MemberRecord{want0, want1, want2, want3}) {
		t.Fatalf("Members() after the batch = %+v", got)
	}
	lease0 = h.f.Lease("L1") // renewed by the batch

	// Refused: nothing changes.
	members := h.f.Members()
	for _, c := range []*fsm.Member{
		{ID: ""},
		{ID: strings.Repeat("n", fsm.MaxServerIDBytes+1), Incarnation: "x"},
		{ID: "n\x01"},
		{ID: "n\u0085"},
		{ID: "n\xff"},
		{ID: "n1", Incarnation: strings.Repeat("i", fsm.MaxIncarnationBytes+1)},
		{ID: "n1", Incarnation: "tab\there"},
		{ID: "n1", Incarnation: "del\x7f"},
		{ID: "n1", Incarnation: "ünï"},
	} {
		// Applied directly: Encode would make invalid UTF-8 valid.
		h.index++
		res := h.f.Apply(h.index, c)
		if len(res) != 1 || code(res[0].Err) != wire.CodeInvalidArgument || res[0].Err.Field == "" {
			t.Errorf("Member %q %q: %+v", c.ID, c.Incarnation, res)
		}
		if ev := h.f.TakeEvents(); len(ev) != 0 {
			t.Errorf("refused Member emitted %v", ev)
		}
	}
	if got := h.f.Members(); !reflect.DeepEqual(got, members) {
		t.Fatalf("refused Members changed the registry: %+v", got)
	}

	// The longest and widest valid values.
	long := fsm.Member{ID: strings.Repeat("ü", fsm.MaxServerIDBytes/2), Incarnation: strings.Repeat("~", fsm.MaxIncarnationBytes-1) + " "}
	if r := h.one(&long); r.Err != nil {
		t.Fatalf("longest member: %v", r.Err)
	}

	if tick, fence, lease := before(); tick != tick0 || fence != fence0 || lease != lease0 {
		t.Fatalf("members changed tick %d->%d, fence %d->%d, or lease %p->%p", tick0, tick, fence0, fence, lease0, lease)
	}
}

// memberState is a state machine with leases, a session and three members,
// one of them a tombstone.
func memberState(t *testing.T) *harness {
	h := newHarness(t)
	h.tick(1)
	h.one(acq("L1", "k", "alice", 10))
	h.one(session("S1", "bob", 10))
	h.one(&fsm.Member{ID: "n2", Incarnation: "inc-b"})
	h.one(&fsm.Member{ID: "n1", Incarnation: "inc-a"})
	h.apply(&fsm.Batch{Commands: []fsm.Command{
		&fsm.Member{ID: "n3", Incarnation: "inc-c", Removed: true},
		renew("L1"),
	}})
	return h
}

// TestMemberSnapshot: the registry is in the snapshot, after the leases, in
// id order, and restores; a snapshot without member records restores to an
// empty registry.
func TestMemberSnapshot(t *testing.T) {
	h := memberState(t)
	want := h.f.Members()
	if len(want) != 3 {
		t.Fatalf("members %+v", want)
	}
	snap := snapshotBytes(t, h.f)

	// Into a fresh machine, and over one holding other members.
	other := memberState(t)
	other.one(&fsm.Member{ID: "n9", Incarnation: "zzz"})
	other.one(&fsm.Member{ID: "n1", Incarnation: "other", Removed: true})
	for _, f := range []*fsm.FSM{fsm.New(), other.f} {
		if err := f.Restore(bytes.NewReader(snap)); err != nil {
			t.Fatal(err)
		}
		if got := f.Members(); !reflect.DeepEqual(got, want) {
			t.Fatalf("restored members %+v, want %+v", got, want)
		}
		if m, ok := f.Member("n9"); ok {
			t.Fatalf("restore kept an earlier member %+v", m)
		}
		if got := snapshotBytes(t, f); !bytes.Equal(got, snap) {
			t.Fatal("the restored state snapshots to other bytes")
		}
		// It goes on recording.
		f.Apply(f.Index()+1, &fsm.Member{ID: "n4", Incarnation: "inc-d"})
		if m, ok := f.Member("n4"); !ok || m.Index != h.index+1 {
			t.Fatalf("after restore: %+v %v", m, ok)
		}
	}

	// The member records: the last three, in id order, with their indexes.
	recs, err := fsm.SplitSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := fsm.SnapshotKeys(snap)
	leases, _ := h.f.Leases(fsm.LeaseFilter{})
	sessions, _ := h.f.Sessions("", "", 0)
	if n := 1 + len(keys) + len(sessions) + len(leases) + len(want); len(recs) != n {
		t.Fatalf("%d records, want %d", len(recs), n)
	}
	tail := recs[len(recs)-3:]
	for i, w := range []string{
		"026e31" + "05696e632d61" + "00" + hexByte(want[0].Index),
		"026e32" + "05696e632d62" + "00" + hexByte(want[1].Index),
		"026e33" + "05696e632d63" + "01" + hexByte(want[2].Index),
	} {
		if got := hex.EncodeToString(tail[i]); got != w {
			t.Errorf("member record %d: %s, want %s", i, got, w)
		}
	}
	// The header ends with the member count.
	if hdr := recs[0]; hdr[len(hdr)-1] != 3 {
		t.Errorf("header % x does not end with the member count", hdr)
	}

	// A state without members snapshots as before the registry existed (the
	// header has no member count); restoring such a snapshot, or a format 1
	// one, empties the registry.
	plain := fsm.New()
	plain.Apply(1, &fsm.Tick{Tick: 1, PeriodMS: periodMS})
	plain.Apply(2, acq("L1", "k", "alice", 10))
	plainSnap := snapshotBytes(t, plain)
	precs, _ := fsm.SplitSnapshot(plainSnap)
	if want := fsm.EncodeHeaderRecord(fsm.SnapshotFormat, 2, 1, 1, 0, 1); !bytes.Equal(precs[0], want) {
		t.Fatalf("header without members % x, want % x", precs[0], want)
	}
	for _, old := range [][]byte{plainSnap, snapshotV1(t, h.f)} {
		f := restored(t, snap)
		if err := f.Restore(bytes.NewReader(old)); err != nil {
			t.Fatal(err)
		}
		if got := f.Members(); len(got) != 0 {
			t.Fatalf("restored a snapshot without members, kept %+v", got)
		}
		if _, ok := f.Member("n1"); ok {
			t.Fatal("Member(n1) after restoring a snapshot without members")
		}
	}
}

func hexByte(v uint64) string {
	if v >= 0x80 {
		panic("index too large for the test")
	}
	return hex.EncodeToString([]byte{byte(v)})
}

// TestMemberSnapshotRejects: corrupted member records or counts fail the
// restore and leave the state as it was.
func TestMemberSnapshotRejects(t *testing.T) {
	h := memberState(t)
	good := snapshotBytes(t, h.f)
	recs, err := fsm.SplitSnapshot(good)
	if err != nil {
		t.Fatal(err)
	}
	last := len(recs) - 1
	hdr := recs[0]
	withHeaderCount := func(count ...byte) string {
		c := slices.Clone(recs)
		c[0] = append(slices.Clone(hdr[:len(hdr)-1]), count...)
		return string(fsm.JoinSnapshot(c))
	}
	with := func(i int, rec []byte) string {
		c := slices.Clone(recs)
		c[i] = rec
		return string(fsm.JoinSnapshot(c))
	}
	swapped := func(i, j int) string {
		c := slices.Clone(recs)
		c[i], c[j] = c[j], c[i]
		return string(fsm.JoinSnapshot(c))
	}
	without := func(i int) string {
		c := slices.Delete(slices.Clone(recs), i, i+1)
		return string(fsm.JoinSnapshot(c))
	}
	boolAt := 1 + 2 + 1 + 5 // id "n3", incarnation "inc-c"
	badBool := slices.Clone(recs[last])
	badBool[boolAt] = 2
	emptyID := append([]byte{0}, recs[last][3:]...)
	for name, data := range map[string]string{
		"more members than records":  withHeaderCount(4),
		"fewer members than records": withHeaderCount(2),
		"member count 0 written":     string(fsm.JoinSnapshot(append([][]byte{append(slices.Clone(hdr[:len(hdr)-1]), 0)}, recs[1:last-2]...))),
		"member count not shortest":  withHeaderCount(0x83, 0x00),
		"trailing byte in header":    withHeaderCount(3, 0),
		"members out of order":       swapped(last, last-1),
		"duplicate member":           with(last, recs[last-1]),
		"member without an id":       with(last, emptyID),
		"member bool 2":              with(last, badBool),
		"trailing bytes in a member": with(last, append(slices.Clone(recs[last]), 0)),
		"truncated member":           with(last, recs[last][:len(recs[last])-1]),
		"missing member record":      without(last),
		"trailing record":            string(fsm.JoinSnapshot(append(slices.Clone(recs), recs[last]))),
	} {
		t.Run(name, func(t *testing.T) {
			if data == string(good) {
				t.Fatal("the corruption did not change the snapshot")
			}
			err := h.f.Restore(strings.NewReader(data))
			if err == nil {
				t.Fatal("Restore accepted a bad snapshot")
			}
			t.Log(err)
			if got := snapshotBytes(t, h.f); !bytes.Equal(got, good) {
				t.Fatal("a failed Restore changed the state")
			}
		})
	}
	// The manipulations above are right: undone, they restore.
	if err := fsm.New().Restore(strings.NewReader(withHeaderCount(3))); err != nil {
		t.Fatal(err)
	}
	fixed := slices.Clone(recs[last])
	fixed[boolAt] = 1
	if err := fsm.New().Restore(strings.NewReader(with(last, fixed))); err != nil {
		t.Fatal(err)
	}
}
