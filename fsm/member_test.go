package fsm_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
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
	if len(res) != 4 || res[0].Err != nil || res[1].Err != nil || res[1].Lease == nil || code(res[2].Err) != fsm.CodeInvalidArgument || res[3].Err != nil {
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
		if len(res) != 1 || code(res[0].Err) != fsm.CodeInvalidArgument || res[0].Err.Field == "" {
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
