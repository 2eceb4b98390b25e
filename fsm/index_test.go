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

// check verifies the shape of x: each list's runs non-empty, at most
// idChunk long, strictly increasing within and across runs, with their
// last values beside them; numbers only while a prefix is set, strings
// none that would be a number; n the total.
func (x *idIndex) check() error {
	if err := x.nums.check(); err != nil {
		return fmt.Errorf("numbers: %v", err)
	}
	if err := x.strs.check(); err != nil {
		return fmt.Errorf("strings: %v", err)
	}
	if len(x.nums.runs) > 0 && !x.set {
		return fmt.Errorf("numbers without a prefix")
	}
	for _, r := range x.strs.runs {
		for _, id := range r {
			if _, ok := x.num(id); ok && x.set {
				return fmt.Errorf("%q kept as a string, prefix %q", id, x.pre)
			}
		}
	}
	if n := x.nums.count() + x.strs.count(); n != x.n {
		return fmt.Errorf("%d ids, n says %d", n, x.n)
	}
	return nil
}

func (x *runList[T]) count() int {
	n := 0
	for _, r := range x.runs {
		n += len(r)
	}
	return n
}

func (x *runList[T]) check() error {
	if len(x.last) != len(x.runs) {
		return fmt.Errorf("%d runs, %d last values", len(x.runs), len(x.last))
	}
	var prev T
	n := 0
	for i, r := range x.runs {
		if len(r) == 0 || len(r) > idChunk {
			return fmt.Errorf("run %d of %d values", i, len(r))
		}
		for _, v := range r {
			if n > 0 && v <= prev {
				return fmt.Errorf("run %d: %v after %v", i, v, prev)
			}
			prev = v
			n++
		}
		if x.last[i] != r[len(r)-1] {
			return fmt.Errorf("run %d: last %v, want %v", i, x.last[i], r[len(r)-1])
		}
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
		if x.n != 0 || x.nums.runs != nil || x.strs.runs != nil {
			t.Fatalf("start %d: emptied index has %d ids in %d and %d runs", start, x.n, len(x.nums.runs), len(x.strs.runs))
		}
	}
}

// TestIDIndexNumbers drives the index with ids the node makes (kept as
// numbers), ids of the same shape with another prefix or upper-case digits,
// shorter and longer ids (kept as strings), ids that are prefixes of
// others, and cursors of every kind, against a sorted set; and builds one
// with fromSorted from a mixture.
func TestIDIndexNumbers(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	hex := func() uint64 { return r.Uint64() >> (uint(r.Intn(4)) * 16) }
	gen := []func() string{
		func() string { return fmt.Sprintf("ls_%016x", hex()) },
		func() string { return fmt.Sprintf("ls_%016x", uint64(r.Intn(40))) },
		func() string { return fmt.Sprintf("ss_%016x", hex()) },
		func() string { return fmt.Sprintf("ls_%016X", hex()) },
		func() string { return fmt.Sprintf("ls_%x", r.Intn(5000)) },
		func() string { return fmt.Sprintf("ls_%016x%d", uint64(r.Intn(40)), r.Intn(3)) },
		func() string { return fmt.Sprintf("%016x", hex()) },
		func() string { return fmt.Sprintf("%c%d", 'a'+r.Intn(26), r.Intn(20)) },
	}
	cursors := []string{"", "a", "l", "ls", "ls_", "ls_0", "ls_00000000000000", "ls_0000000000000013",
		"ls_000000000000001", "ls_00000000000000130", "ls_8", "ls_ffffffffffffffff", "ls_g", "lt", "ss_", "zz", "\xff"}
	for round, kinds := range [][]int{{0, 1}, {0, 1, 2, 3, 4, 5}, {6, 0, 7}, {4, 5, 0, 1}, {2, 0}} {
		var x idIndex
		set := map[string]bool{}
		for step := range 8000 {
			id := gen[kinds[r.Intn(len(kinds))]]()
			if r.Intn(4) == 0 {
				if ids := x.ids(); len(ids) > 0 && r.Intn(2) == 0 {
					id = ids[r.Intn(len(ids))]
				}
				x.remove(id)
				delete(set, id)
			} else {
				x.insert(id)
				set[id] = true
			}
			if step%113 != 0 && step != 7999 {
				continue
			}
			if err := x.check(); err != nil {
				t.Fatalf("round %d step %d (%q): %v", round, step, id, err)
			}
			want := sortedKeys(set)
			if got := x.ids(); !slices.Equal(got, want) {
				t.Fatalf("round %d step %d: ids() gives %d, want %d", round, step, len(got), len(want))
			}
			for _, after := range append(cursors, id, id+"0") {
				var got []string
				x.ascend(after, func(id string) bool { got = append(got, id); return true })
				var exp []string
				for _, id := range want {
					if id > after {
						exp = append(exp, id)
					}
				}
				if !slices.Equal(got, exp) {
					t.Fatalf("round %d step %d after %q: got %d ids, want %d", round, step, after, len(got), len(exp))
				}
			}
		}
		if round == 1 && len(x.nums.runs) == 0 {
			t.Fatalf("round %d kept no id as a number", round)
		}
		var y idIndex
		want := sortedKeys(set)
		y.fromSorted(len(want), func(i int) string { return want[i] })
		if err := y.check(); err != nil {
			t.Fatalf("round %d fromSorted: %v", round, err)
		}
		if got := y.ids(); !slices.Equal(got, want) {
			t.Fatalf("round %d fromSorted: ids() gives %d, want %d", round, len(got), len(want))
		}
		for _, id := range want {
			y.remove(id)
		}
		if y.n != 0 || y.nums.runs != nil || y.strs.runs != nil {
			t.Fatalf("round %d: emptied index has %d ids", round, y.n)
		}
	}
}
