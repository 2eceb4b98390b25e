package fsm_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// step is one entry of a scenario: a command with the error code its first
// result must carry, or (cmd nil) a clock advance, then an optional check.
type step struct {
	cmd   fsm.Command
	want  wire.Code
	ticks int    // with cmd nil: advance this many ticks
	to    uint64 // with cmd nil: advance to this tick
	check func(t *testing.T, h *harness, res []fsm.Result)
}

func do(c fsm.Command, want wire.Code) step { return step{cmd: c, want: want} }

func doCheck(c fsm.Command, want wire.Code, check func(*testing.T, *harness, []fsm.Result)) step {
	return step{cmd: c, want: want, check: check}
}

func ticks(n int) step     { return step{ticks: n} }
func tickTo(t uint64) step { return step{to: t} }
func check(fn func(*testing.T, *harness, []fsm.Result)) step {
	return step{check: fn}
}

// leaseIs checks the state and end reason of lease id.
func leaseIs(id string, state fsm.State, reason string) step {
	return check(func(t *testing.T, h *harness, _ []fsm.Result) {
		t.Helper()
		l := h.f.Lease(id)
		if l == nil {
			t.Fatalf("lease %s: missing, want %s", id, state)
		}
		if l.State != state || l.EndReason() != reason {
			t.Fatalf("lease %s: state %s reason %q, want %s %q", id, l.State, l.EndReason(), state, reason)
		}
	})
}

func leaseGone(id string) step {
	return check(func(t *testing.T, h *harness, _ []fsm.Result) {
		t.Helper()
		if l := h.f.Lease(id); l != nil {
			t.Fatalf("lease %s: present (%s), want none", id, l.State)
		}
	})
}

// eventTypes checks the types and lease/session ids of the last entry's events.
func eventTypes(want ...string) step {
	return check(func(t *testing.T, h *harness, _ []fsm.Result) {
		t.Helper()
		var got []string
		for _, e := range h.events {
			s := string(e.Type)
			switch {
			case e.Lease != nil:
				s += " " + e.Lease.ID
			case e.Session != nil:
				s += " " + e.Session.ID
			case e.Reason != "":
				s += " " + e.Reason
			}
			got = append(got, s)
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Fatalf("events [%s], want [%s]", strings.Join(got, ", "), strings.Join(want, ", "))
		}
	})
}

// noticesAre checks the last entry's notices as "id granted" or "id CODE".
func noticesAre(want ...string) step {
	return check(func(t *testing.T, h *harness, _ []fsm.Result) {
		t.Helper()
		var got []string
		for _, n := range h.notices {
			switch {
			case n.Lease != nil && n.Err == nil && n.Lease.ID == n.LeaseID:
				got = append(got, n.LeaseID+" granted")
			case n.Lease == nil && n.Err != nil:
				got = append(got, n.LeaseID+" "+string(n.Err.Code))
			default:
				got = append(got, fmt.Sprintf("%s malformed %+v", n.LeaseID, n))
			}
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Fatalf("notices [%s], want [%s]", strings.Join(got, ", "), strings.Join(want, ", "))
		}
	})
}

// lockDelay checks the LOCK_DELAY error of an acquire on key at this tick.
func lockDelay(id, key string, remaining int64) step {
	return doCheck(acq(id, key, "bob", 10), wire.CodeLockDelay, func(t *testing.T, h *harness, res []fsm.Result) {
		if e := res[0].Err; e.Key != key || e.RemainingMS != remaining {
			t.Fatalf("LOCK_DELAY key %q remaining %d, want %q %d", e.Key, e.RemainingMS, key, remaining)
		}
	})
}
