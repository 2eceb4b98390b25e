package fsm

import (
	"cmp"
	"slices"
	"strings"
)

// idChunk is the most ids one run of an idIndex holds; a longer one splits.
const idChunk = 256

// idIndex is an ordered set of ids. It lets listings walk ids in order from
// a cursor without sorting every record on every page.
//
// The ids the node makes (a prefix, then 16 lowercase hex digits: "ls_",
// "cl_", "ss_") are kept as numbers, one list for each prefix, whose order
// is the ids' order: half the memory of string headers, searches over
// contiguous numbers, and inserts that move no pointers (no write
// barrier). Every other id (another prefix once maxNumGroups are taken, other digits,
// any length) is kept as a string, and a walk merges the lists. The zero
// value is an empty set.
type idIndex struct {
	groups []numGroup      // at most maxNumGroups, each its own prefix; never removed
	strs   runList[string] // every other id
	n      int
}

// numGroup is the ids of one prefix followed by 16 lowercase hex digits,
// kept as the numbers those digits spell.
type numGroup struct {
	pre  string
	nums runList[uint64]
}

// maxNumGroups bounds the prefixes an index keeps as numbers: a walk
// merges one list more for each.
const maxNumGroups = 4

// hexDigits is how many hex digits follow the prefix of a numbered id,
// written with hexLower.
const (
	hexDigits = 16
	hexLower  = "0123456789abcdef"
)

// num returns id's group and number if id is a prefix of at most 16 bytes
// followed by 16 lowercase hex digits and its prefix has a group (g is
// len(groups) when it has none yet and there is room for one; ok is false
// when it cannot be a number here).
func (x *idIndex) num(id string) (g int, v uint64, ok bool) {
	p := len(id) - hexDigits
	if p < 0 || p > 16 {
		return 0, 0, false
	}
	for i := p; i < len(id); i++ {
		c := id[i]
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | uint64(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | uint64(c-'a'+10)
		default:
			return 0, 0, false
		}
	}
	for g := range x.groups {
		if x.groups[g].pre == id[:p] {
			return g, v, true
		}
	}
	return len(x.groups), v, len(x.groups) < maxNumGroups
}

// group returns the group of id's prefix, making it if g is past the last.
func (x *idIndex) group(g int, id string) *numGroup {
	if g == len(x.groups) {
		x.groups = append(x.groups, numGroup{pre: strings.Clone(id[:len(id)-hexDigits])})
	}
	return &x.groups[g]
}

// id is the id of number v.
func (ng *numGroup) id(v uint64) string {
	var b [32]byte
	n := copy(b[:], ng.pre)
	for i := hexDigits - 1; i >= 0; i-- {
		b[n+i] = hexLower[v&15]
		v >>= 4
	}
	return string(b[:n+hexDigits])
}

// cmp compares the id of number v with s, without making the id.
func (ng *numGroup) cmp(v uint64, s string) int {
	n := len(ng.pre) + hexDigits
	for i := 0; i < n; i++ {
		if i == len(s) {
			return 1
		}
		var c byte
		if i < len(ng.pre) {
			c = ng.pre[i]
		} else {
			c = hexLower[v>>(4*(n-1-i))&15]
		}
		if c != s[i] {
			return cmp.Compare(c, s[i])
		}
	}
	if n < len(s) {
		return -1
	}
	return 0
}

func (x *idIndex) insert(id string) {
	g, v, ok := x.num(id)
	if ok && x.group(g, id).nums.insert(v) || !ok && x.strs.insert(id) {
		x.n++
	}
}

func (x *idIndex) remove(id string) {
	g, v, ok := x.num(id)
	if ok && g == len(x.groups) {
		return // a number of a prefix never inserted
	}
	if ok && x.groups[g].nums.remove(v) || !ok && x.strs.remove(id) {
		x.n--
	}
}

// cursor is a walk's position in one list: the string list (g < 0) or
// group g's, at run i, place j; head is the id there, made once.
type cursor struct {
	g, i, j int
	head    string
	ok      bool
}

// ascend calls fn for each id greater than after, in order, until fn
// returns false. fn must not change the index.
func (x *idIndex) ascend(after string, fn func(id string) bool) {
	cs := make([]cursor, 0, len(x.groups)+1)
	for g := range x.groups {
		ng := &x.groups[g]
		i, j := ng.nums.search(func(v uint64) bool { return ng.cmp(v, after) > 0 })
		cs = append(cs, cursor{g: g, i: i, j: j})
	}
	i, j := x.strs.search(func(s string) bool { return s > after })
	x.walk(append(cs, cursor{g: -1, i: i, j: j}), fn)
}

// walk calls fn for the ids from the cursors on, merged in order, until fn
// returns false. The lists hold no id twice: an id is a number of its
// prefix's group if it has one, else a string.
func (x *idIndex) walk(cs []cursor, fn func(id string) bool) {
	load := func(c *cursor) {
		if c.g < 0 {
			c.head, c.ok = x.strs.at(c.i, c.j)
			return
		}
		ng := &x.groups[c.g]
		var v uint64
		if v, c.ok = ng.nums.at(c.i, c.j); c.ok {
			c.head = ng.id(v)
		}
	}
	for k := range cs {
		load(&cs[k])
	}
	for {
		m := -1
		for k := range cs {
			if cs[k].ok && (m < 0 || cs[k].head < cs[m].head) {
				m = k
			}
		}
		if m < 0 || !fn(cs[m].head) {
			return
		}
		c := &cs[m]
		if c.g < 0 {
			c.i, c.j = x.strs.next(c.i, c.j)
		} else {
			c.i, c.j = x.groups[c.g].nums.next(c.i, c.j)
		}
		load(c)
	}
}

// ids returns the ids in order.
func (x *idIndex) ids() []string {
	out := make([]string, 0, x.n)
	cs := make([]cursor, 0, len(x.groups)+1)
	for g := range x.groups {
		cs = append(cs, cursor{g: g})
	}
	x.walk(append(cs, cursor{g: -1}), func(id string) bool { out = append(out, id); return true })
	return out
}

// fromSorted replaces the contents with the n ids id(0) < id(1) < ...,
// in runs three quarters full. Groups already made keep their prefixes.
func (x *idIndex) fromSorted(n int, id func(int) string) {
	groups := x.groups
	for g := range groups {
		groups[g].nums = runList[uint64]{}
	}
	*x = idIndex{groups: groups, n: n}
	var nums [maxNumGroups][]uint64
	var strs []string
	for i := range n {
		s := id(i)
		if g, v, ok := x.num(s); ok {
			x.group(g, s)
			nums[g] = append(nums[g], v)
		} else {
			strs = append(strs, s)
		}
	}
	for g := range x.groups {
		x.groups[g].nums.fromSorted(nums[g])
	}
	x.strs.fromSorted(strs)
}

// runList is an ordered set: sorted runs of at most idChunk values, each
// run's values below the next run's, and beside them the last value of
// each run, which a search looks through without touching the runs.
// Inserting or removing moves at most a run's worth of values.
type runList[T cmp.Ordered] struct {
	runs [][]T // sorted, none empty
	last []T   // last[i] is runs[i]'s last value
}

// find returns the run where v is or would go (the first whose last value
// is >= v, or the last run), v's position in it, and whether it is there.
// The list must not be empty.
func (x *runList[T]) find(v T) (i, j int, found bool) {
	i, _ = slices.BinarySearch(x.last, v)
	i = min(i, len(x.runs)-1)
	j, found = slices.BinarySearch(x.runs[i], v)
	return i, j, found
}

// search returns the position of the first value for which after (true
// from some value on, in order) holds: its run and its place in it, or the
// end (at reports false there).
func (x *runList[T]) search(after func(T) bool) (i, j int) {
	i, _ = slices.BinarySearchFunc(x.last, true, func(v T, _ bool) int {
		if after(v) {
			return 1
		}
		return -1
	})
	if i == len(x.runs) {
		return i, 0
	}
	j, _ = slices.BinarySearchFunc(x.runs[i], true, func(v T, _ bool) int {
		if after(v) {
			return 1
		}
		return -1
	})
	return i, j
}

// at returns the value at run i, place j, if there is one.
func (x *runList[T]) at(i, j int) (T, bool) {
	if i >= len(x.runs) {
		var zero T
		return zero, false
	}
	return x.runs[i][j], true
}

// next returns the position after run i, place j.
func (x *runList[T]) next(i, j int) (int, int) {
	if j+1 < len(x.runs[i]) {
		return i, j + 1
	}
	return i + 1, 0
}

func (x *runList[T]) setRun(i int, r []T) {
	x.runs[i], x.last[i] = r, r[len(r)-1]
}

// insert adds v and reports whether it was not there.
func (x *runList[T]) insert(v T) bool {
	if len(x.runs) == 0 {
		x.runs, x.last = [][]T{{v}}, []T{v}
		return true
	}
	i := len(x.runs) - 1
	if r := x.runs[i]; v > x.last[i] {
		// Appending past the end, the common case for values that
		// grow: a full last run is left full.
		if len(r) < idChunk {
			x.setRun(i, append(r, v))
		} else {
			x.runs = append(x.runs, append(make([]T, 0, 8), v))
			x.last = append(x.last, v)
		}
		return true
	}
	i, j, found := x.find(v)
	if found {
		return false
	}
	r := x.runs[i]
	if len(r) < idChunk {
		x.setRun(i, slices.Insert(roomInRun(r), j, v))
		return true
	}
	h := len(r) / 2
	left, right := clipRun(r[:h], 1), clipRun(r[h:], 1)
	if j <= h {
		left = slices.Insert(left, j, v)
	} else {
		right = slices.Insert(right, j-h, v)
	}
	x.setRun(i, left)
	x.runs = slices.Insert(x.runs, i+1, right)
	x.last = slices.Insert(x.last, i+1, right[len(right)-1])
	return true
}

// roomInRun returns r with room for one more value: a full run grows by a
// quarter, never past idChunk. Left to append, a run of 161 grew to 336
// values (a size class above idChunk) that it could never fill.
func roomInRun[T any](r []T) []T {
	if len(r) < cap(r) {
		return r
	}
	out := make([]T, len(r), min(idChunk, len(r)+1+len(r)/4))
	copy(out, r)
	return out
}

// clipRun copies r into a new run with room for extra more values.
func clipRun[T any](r []T, extra int) []T {
	out := make([]T, len(r), len(r)+extra+len(r)/4)
	copy(out, r)
	return out
}

func (x *runList[T]) deleteRun(i int) {
	x.runs = slices.Delete(x.runs, i, i+1)
	x.last = slices.Delete(x.last, i, i+1)
	if len(x.runs) == 0 {
		x.runs, x.last = nil, nil
	}
}

// remove removes v and reports whether it was there.
func (x *runList[T]) remove(v T) bool {
	if len(x.runs) == 0 {
		return false
	}
	i, j, found := x.find(v)
	if !found {
		return false
	}
	r := x.runs[i]
	if j < len(r)/2 {
		// Move the shorter side: ids are often removed in order (an
		// expiry storm, pruning), so from the front of a run.
		copy(r[1:j+1], r[:j])
		var zero T
		r[0] = zero
		r = r[1:]
	} else {
		r = slices.Delete(r, j, j+1)
	}
	switch {
	case len(r) == 0:
		x.deleteRun(i)
	case i+1 < len(x.runs) && len(r)+len(x.runs[i+1]) <= idChunk/2:
		x.setRun(i, append(clipRun(r, len(x.runs[i+1])), x.runs[i+1]...))
		x.deleteRun(i + 1)
	case i > 0 && len(r)+len(x.runs[i-1]) <= idChunk/2:
		x.setRun(i-1, append(clipRun(x.runs[i-1], len(r)), r...))
		x.deleteRun(i)
	case cap(r) >= 4*len(r)+16:
		x.setRun(i, clipRun(r, 0)) // give back what a shrunken run holds
	default:
		x.setRun(i, r)
	}
	return true
}

// fromSorted replaces the contents with vs (sorted, distinct), in runs
// three quarters full.
func (x *runList[T]) fromSorted(vs []T) {
	const size = idChunk * 3 / 4
	x.runs, x.last = nil, nil
	if len(vs) == 0 {
		return
	}
	runs := (len(vs) + size - 1) / size
	x.runs, x.last = make([][]T, 0, runs), make([]T, 0, runs)
	for i := 0; i < len(vs); i += size {
		r := slices.Clone(vs[i:min(len(vs), i+size)])
		x.runs = append(x.runs, r)
		x.last = append(x.last, r[len(r)-1])
	}
}
