package fsm

import (
	"slices"
	"sort"
)

// idChunk is the most ids one run of an idIndex holds; a longer one splits.
const idChunk = 256

// idIndex is an ordered set of ids: a list of sorted runs of at most idChunk
// ids, each run's ids below the next run's. It lets listings walk ids in
// order from a cursor without sorting every record on every page, and costs
// about 20 bytes an id (a string header and some slack), a fraction of a
// tree node per id. Inserting or removing moves at most a run's worth of
// string headers. The zero value is an empty set.
type idIndex struct {
	runs [][]string // sorted, none empty
	n    int
}

// run returns the index of the run where id is or would go: the first whose
// last id is >= id, or the last run.
func (x *idIndex) run(id string) int {
	i := sort.Search(len(x.runs), func(i int) bool {
		r := x.runs[i]
		return r[len(r)-1] >= id
	})
	return min(i, len(x.runs)-1)
}

func (x *idIndex) insert(id string) {
	if len(x.runs) == 0 {
		x.runs = [][]string{{id}}
		x.n = 1
		return
	}
	i := len(x.runs) - 1
	r := x.runs[i]
	if last := r[len(r)-1]; id > last {
		// Appending past the end, the common case for ids that grow: a
		// full last run is left full.
		x.n++
		if len(r) < idChunk {
			x.runs[i] = append(r, id)
		} else {
			x.runs = append(x.runs, append(make([]string, 0, 8), id))
		}
		return
	}
	i = x.run(id)
	r = x.runs[i]
	j, found := slices.BinarySearch(r, id)
	if found {
		return
	}
	x.n++
	if len(r) < idChunk {
		x.runs[i] = slices.Insert(roomInRun(r), j, id)
		return
	}
	h := len(r) / 2
	left, right := clipRun(r[:h], 1), clipRun(r[h:], 1)
	if j <= h {
		left = slices.Insert(left, j, id)
	} else {
		right = slices.Insert(right, j-h, id)
	}
	x.runs[i] = left
	x.runs = slices.Insert(x.runs, i+1, right)
}

// clipRun copies r into a new run with room for extra more ids.
// roomInRun returns r with room for one more id: a full run grows by a
// quarter, never past idChunk. Left to append, a run of 161 grew to 336
// ids (a size class above idChunk) that it could never fill.
func roomInRun(r []string) []string {
	if len(r) < cap(r) {
		return r
	}
	out := make([]string, len(r), min(idChunk, len(r)+1+len(r)/4))
	copy(out, r)
	return out
}

func clipRun(r []string, extra int) []string {
	out := make([]string, len(r), len(r)+extra+len(r)/4)
	copy(out, r)
	return out
}

func (x *idIndex) remove(id string) {
	if len(x.runs) == 0 {
		return
	}
	i := x.run(id)
	r := x.runs[i]
	j, found := slices.BinarySearch(r, id)
	if !found {
		return
	}
	x.n--
	if j < len(r)/2 {
		// Move the shorter side: ids are often removed in order (an
		// expiry storm, pruning), so from the front of a run.
		copy(r[1:j+1], r[:j])
		r[0] = ""
		r = r[1:]
	} else {
		r = slices.Delete(r, j, j+1)
	}
	switch {
	case len(r) == 0:
		x.runs = slices.Delete(x.runs, i, i+1)
		if len(x.runs) == 0 {
			x.runs = nil
		}
		return
	case i+1 < len(x.runs) && len(r)+len(x.runs[i+1]) <= idChunk/2:
		x.runs[i] = append(clipRun(r, len(x.runs[i+1])), x.runs[i+1]...)
		x.runs = slices.Delete(x.runs, i+1, i+2)
	case i > 0 && len(r)+len(x.runs[i-1]) <= idChunk/2:
		x.runs[i-1] = append(clipRun(x.runs[i-1], len(r)), r...)
		x.runs = slices.Delete(x.runs, i, i+1)
	case cap(r) >= 4*len(r)+16:
		x.runs[i] = clipRun(r, 0) // give back what a shrunken run holds
	default:
		x.runs[i] = r
	}
}

// ascend calls fn for each id greater than after, in order, until fn
// returns false. fn must not change the index.
func (x *idIndex) ascend(after string, fn func(id string) bool) {
	i := sort.Search(len(x.runs), func(i int) bool {
		r := x.runs[i]
		return r[len(r)-1] > after
	})
	for k := i; k < len(x.runs); k++ {
		r := x.runs[k]
		if k == i {
			j, found := slices.BinarySearch(r, after)
			if found {
				j++
			}
			r = r[j:]
		}
		for _, id := range r {
			if !fn(id) {
				return
			}
		}
	}
}

// ids returns the ids in order.
func (x *idIndex) ids() []string {
	out := make([]string, 0, x.n)
	for _, r := range x.runs {
		out = append(out, r...)
	}
	return out
}

// fromSorted replaces the contents with the n ids id(0) < id(1) < ...,
// in runs three quarters full.
func (x *idIndex) fromSorted(n int, id func(int) string) {
	const size = idChunk * 3 / 4
	x.runs, x.n = nil, n
	if n == 0 {
		return
	}
	x.runs = make([][]string, 0, (n+size-1)/size)
	for i := 0; i < n; i += size {
		r := make([]string, min(size, n-i))
		for j := range r {
			r[j] = id(i + j)
		}
		x.runs = append(x.runs, r)
	}
}
