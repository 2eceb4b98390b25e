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
			if err := ascendMatches(&x, want, after); err != nil {
				t.Fatalf("step %d: %v", i, err)
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

// ascendMatches compares what x.ascend(after) walks with the ids of want
// (sorted) above after.
func ascendMatches(x *idIndex, want []string, after string) error {
	var got []string
	x.ascend(after, func(id string) bool { got = append(got, id); return true })
	var exp []string
	for _, id := range want {
		if id > after {
			exp = append(exp, id)
		}
	}
	if !slices.Equal(got, exp) {
		return fmt.Errorf("after %q: got %d ids, want %d", after, len(got), len(exp))
	}
	return nil
}

// check verifies the shape of x: each list's runs non-empty, at most
// idChunk long, strictly increasing within and across runs, with their
// last values beside them; groups of distinct prefixes, at most
// maxNumGroups; no string that would be a number of a group (or of a new
// one while there is room); n the total.
func (x *idIndex) check() error {
	if len(x.groups) > maxNumGroups {
		return fmt.Errorf("%d groups", len(x.groups))
	}
	n := x.strs.count()
	for g := range x.groups {
		if err := x.groups[g].nums.check(); err != nil {
			return fmt.Errorf("group %q: %v", x.groups[g].pre, err)
		}
		for h := range g {
			if x.groups[h].pre == x.groups[g].pre {
				return fmt.Errorf("two groups of prefix %q", x.groups[g].pre)
			}
		}
		n += x.groups[g].nums.count()
	}
	if err := x.strs.check(); err != nil {
		return fmt.Errorf("strings: %v", err)
	}
	for _, r := range x.strs.runs {
		for _, id := range r {
			if _, _, ok := x.num(id); ok {
				return fmt.Errorf("%q kept as a string", id)
			}
		}
	}
	if n != x.n {
		return fmt.Errorf("%d ids, n says %d", n, x.n)
	}
	return nil
}

// emptied reports whether x holds no run at all.
func (x *idIndex) emptied() bool {
	for _, g := range x.groups {
		if g.nums.runs != nil {
			return false
		}
	}
	return x.n == 0 && x.strs.runs == nil
}

// numbered is how many ids x keeps as numbers.
func (x *idIndex) numbered() int {
	n := 0
	for _, g := range x.groups {
		n += g.nums.count()
	}
	return n
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
		if !x.emptied() {
			t.Fatalf("start %d: emptied index has %d ids", start, x.n)
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
				if err := ascendMatches(&x, want, after); err != nil {
					t.Fatalf("round %d step %d: %v", round, step, err)
				}
			}
		}
		if round == 1 && x.numbered() == 0 {
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
		if !y.emptied() {
			t.Fatalf("round %d: emptied index has %d ids", round, y.n)
		}
	}
}

// TestIDIndexPrefixes: a control lease's id ("cl_") coming first, by grant
// or by sort order in a restore, leaves the lease ids ("ls_") numbers of
// their own group; prefixes beyond maxNumGroups are kept as strings.
func TestIDIndexPrefixes(t *testing.T) {
	var x idIndex
	x.insert("cl_00000000000000ff")
	var ls []string
	for i := range 1000 {
		id := fmt.Sprintf("ls_%016x", uint64(i)*0x9e3779b97f4a7c15)
		ls = append(ls, id)
		x.insert(id)
	}
	if got := x.numbered(); got != 1001 {
		t.Fatalf("%d of 1001 ids kept as numbers, groups %d", got, len(x.groups))
	}
	want := append(slices.Clone(ls), "cl_00000000000000ff")
	slices.Sort(want)
	var y idIndex
	y.fromSorted(len(want), func(i int) string { return want[i] })
	if got := y.numbered(); got != 1001 {
		t.Fatalf("fromSorted kept %d of 1001 ids as numbers", got)
	}
	if !slices.Equal(y.ids(), want) || !slices.Equal(x.ids(), want) {
		t.Fatal("ids out of order")
	}
	for i, pre := range []string{"aa_", "bb_", "cc_", "dd_"} {
		y.insert(fmt.Sprintf("%s%016x", pre, i))
	}
	if len(y.groups) != maxNumGroups || y.numbered() != 1001+maxNumGroups-2 || y.n != 1005 {
		t.Fatalf("%d groups, %d numbers, %d ids", len(y.groups), y.numbered(), y.n)
	}
	if err := y.check(); err != nil {
		t.Fatal(err)
	}
	var got []string
	y.ascend("cl_", func(id string) bool { got = append(got, id); return len(got) < 3 })
	if !slices.Equal(got, []string{"cl_00000000000000ff", "dd_0000000000000003", want[1]}) {
		t.Fatalf("ascend from cl_: %v", got)
	}
}
