package fsm

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

func TestIDIndexMatchesSortedSet(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	var x idIndex
	set := map[string]bool{}
	for i := range 5000 {
		id := fmt.Sprintf("ls_%04x", r.Intn(3000))
		if r.Intn(3) == 0 {
			x.remove(id)
			delete(set, id)
		} else {
			x.insert(id)
			set[id] = true
		}
		if i%250 != 0 {
			continue
		}
		want := sortedKeys(set)
		if x.n != len(want) {
			t.Fatalf("step %d: size %d, want %d", i, x.n, len(want))
		}
		for _, after := range []string{"", "ls_0400", "ls_0fff", "zz"} {
			var got []string
			x.ascend(after, func(id string) bool { got = append(got, id); return true })
			var exp []string
			for _, id := range want {
				if id > after {
					exp = append(exp, id)
				}
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("step %d after %q: got %d ids, want %d", i, after, len(got), len(exp))
			}
		}
	}
	// Early stop.
	n := 0
	x.ascend("", func(string) bool { n++; return n < 10 })
	if n != 10 {
		t.Fatalf("ascend did not stop: %d", n)
	}
}

// check verifies the shape of x: runs non-empty, at most idChunk long,
// strictly increasing within and across runs, n their total.
func (x *idIndex) check() error {
	n, prev := 0, ""
	for i, r := range x.runs {
		if len(r) == 0 || len(r) > idChunk {
			return fmt.Errorf("run %d of %d ids", i, len(r))
		}
		for _, id := range r {
			if n > 0 && id <= prev {
				return fmt.Errorf("run %d: %q after %q", i, id, prev)
			}
			prev = id
			n++
		}
	}
	if n != x.n {
		return fmt.Errorf("%d ids, n says %d", n, x.n)
	}
	return nil
}

func TestIDIndexRuns(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	for _, start := range []int{0, 1, 191, 192, 193, 5000} {
		var x idIndex
		set := map[string]bool{}
		ids := make([]string, start)
		for i := range ids {
			ids[i] = fmt.Sprintf("id_%06d", 2*i)
			set[ids[i]] = true
		}
		x.fromSorted(len(ids), func(i int) string { return ids[i] })
		if err := x.check(); err != nil {
			t.Fatalf("fromSorted(%d): %v", start, err)
		}
		next := 2 * start
		for step := range 20000 {
			var id string
			switch k := r.Intn(10); {
			case k < 3: // ids that grow
				id = fmt.Sprintf("id_%06d", next)
				next++
				x.insert(id)
				set[id] = true
			case k < 6:
				id = fmt.Sprintf("id_%06d", r.Intn(next+1))
				x.insert(id)
				set[id] = true
			default:
				id = fmt.Sprintf("id_%06d", r.Intn(next+1))
				x.remove(id)
				delete(set, id)
			}
			if step%25 != 0 {
				continue
			}
			if err := x.check(); err != nil {
				t.Fatalf("start %d step %d (%s): %v", start, step, id, err)
			}
		}
		if got, want := x.ids(), sortedKeys(set); !slices.Equal(got, want) {
			t.Fatalf("start %d: %d ids, want %d", start, len(got), len(want))
		}
		for _, id := range sortedKeys(set) {
			x.remove(id)
		}
		if x.n != 0 || x.runs != nil {
			t.Fatalf("start %d: emptied index has %d ids in %d runs", start, x.n, len(x.runs))
		}
	}
}
