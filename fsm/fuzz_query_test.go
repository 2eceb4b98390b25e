package fsm_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// queryState is a state with leases of several keys, holders, sessions and
// every state, for FuzzLeaseFilter.
var queryState = sync.OnceValue(func() *fsm.FSM {
	f := fsm.New()
	i := uint64(0)
	apply := func(c fsm.Command) {
		i++
		if r := f.Apply(i, c); r[0].Err != nil {
			panic(fmt.Sprintf("%T: %v", c, r[0].Err))
		}
	}
	apply(&fsm.Tick{Tick: 1, PeriodMS: periodMS, RetainTicks: 1000})
	apply(session("S1", "alice", 100))
	apply(session("S2", "bob", 100))
	for n := range 40 {
		id := fmt.Sprintf("L%02d", n)
		key := fmt.Sprintf("%s/%d", []string{"cam", "tuner", "ctl", "c"}[n%4], n%7)
		holder := []string{"alice", "bob", "carol"}[n%3]
		var c *fsm.Acquire
		if n%5 == 0 {
			c = bound(id, key+"/b", []string{"S1", "S2"}[n%2])
		} else {
			c = withLimit(acq(id, key, holder, uint64(5+n)), 40)
		}
		apply(c)
		switch n % 4 {
		case 1:
			apply(release(id))
		case 2:
			apply(&fsm.Revoke{LeaseID: id})
		}
	}
	for t := uint64(2); t < 20; t++ { // some expire
		apply(&fsm.Tick{Tick: t, PeriodMS: periodMS, RetainTicks: 1000})
	}
	return f
})

// FuzzLeaseFilter: a listing with any filter, paged with any page size by
// following its cursor, returns exactly the leases that match, in id order,
// each once, never more than a page at a time.
func FuzzLeaseFilter(f *testing.F) {
	f.Add("", "", "", "", "", "", 0)
	f.Add("cam/1", "", "", "", "active", "", 3)
	f.Add("", "tuner/", "bob", "", "", "L10", 2)
	f.Add("", "", "alice", "", "active", "", 1)
	f.Add("", "c", "", "S1", "expired", "", 4)
	f.Add("", "", "", "", "released", "L", 7)
	f.Fuzz(func(t *testing.T, key, prefix, holder, session, state, after string, limit int) {
		m := queryState()
		limit = max(1, limit%50) // the node bounds pages to 1-1000
		q := fsm.LeaseFilter{Key: key, Prefix: prefix, Holder: holder, SessionID: session, State: parseStateOr(state), After: after}
		all, next := m.Leases(fsm.LeaseFilter{})
		if next != "" {
			t.Fatalf("an unlimited listing has a cursor %q", next)
		}
		var want []string
		for _, l := range all {
			if (after == "" || l.ID > after) && (key == "" || l.Key == key) && strings.HasPrefix(l.Key, prefix) &&
				(holder == "" || l.Holder == holder) && (session == "" || l.SessionID == session) &&
				(state == "" || l.State.String() == state) {
				want = append(want, l.ID)
			}
		}
		var got []string
		for page := 0; ; page++ {
			if page > len(all)+1 {
				t.Fatal("the cursor does not advance")
			}
			q.Limit = limit
			ls, next := m.Leases(q)
			if len(ls) > limit {
				t.Fatalf("%d leases in a page of %d", len(ls), limit)
			}
			for _, l := range ls {
				got = append(got, l.ID)
			}
			if next == "" {
				break
			}
			if len(ls) == 0 || next != ls[len(ls)-1].ID {
				t.Fatalf("cursor %q after a page ending %v", next, ls)
			}
			q.After = next
		}
		if !slices.Equal(got, want) {
			t.Fatalf("filter %+v, pages of %d:\n got %v\nwant %v", q, limit, got, want)
		}
	})
}

// parseStateOr is the state named name, or one no record has (the filter
// of an unknown name matches nothing, as the string state's did).
func parseStateOr(name string) fsm.State {
	if st, ok := fsm.ParseState(name); ok {
		return st
	}
	return fsm.State(200)
}
