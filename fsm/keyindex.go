package fsm

import (
	"slices"
	"sort"
)

// keyRef is a key and how many lease records (any state) have it.
type keyRef struct {
	key string
	n   int32
}

// keyIndex is the ordered set of the keys that lease records have, each
// with its count of records, in sorted runs of at most idChunk like idIndex.
// It replaced a map of counts beside an idIndex of the same keys: with a
// million keys the map cost about 50 bytes a key, the count here costs 8.
// Finding a key takes a binary search (about 20 comparisons for a million).
type keyIndex struct {
	runs [][]keyRef // sorted by key, none empty
	n    int
}

// find returns the run where key is or would go and its position in it.
func (x *keyIndex) find(key string) (i, j int, found bool) {
	i = sort.Search(len(x.runs), func(i int) bool {
		r := x.runs[i]
		return r[len(r)-1].key >= key
	})
	i = min(i, len(x.runs)-1)
	r := x.runs[i]
	j = sort.Search(len(r), func(j int) bool { return r[j].key >= key })
	return i, j, j < len(r) && r[j].key == key
}

// count is the number of records with key.
func (x *keyIndex) count(key string) int32 {
	if len(x.runs) == 0 {
		return 0
	}
	i, j, found := x.find(key)
	if !found {
		return 0
	}
	return x.runs[i][j].n
}

// add counts one more record with key.
func (x *keyIndex) add(key string) {
	if len(x.runs) == 0 {
		x.runs = [][]keyRef{{{key, 1}}}
		x.n = 1
		return
	}
	last := x.runs[len(x.runs)-1]
	if key > last[len(last)-1].key {
		x.n++
		if len(last) < idChunk {
			x.runs[len(x.runs)-1] = append(last, keyRef{key, 1})
		} else {
			x.runs = append(x.runs, append(make([]keyRef, 0, 8), keyRef{key, 1}))
		}
		return
	}
	i, j, found := x.find(key)
	r := x.runs[i]
	if found {
		r[j].n++
		return
	}
	x.n++
	if len(r) < idChunk {
		x.runs[i] = insertRef(r, j, keyRef{key, 1})
		return
	}
	h := len(r) / 2
	left, right := clipRun(r[:h], 1), clipRun(r[h:], 1)
	if j <= h {
		left = insertRef(left, j, keyRef{key, 1})
	} else {
		right = insertRef(right, j-h, keyRef{key, 1})
	}
	x.runs[i] = left
	x.runs = append(x.runs, nil)
	copy(x.runs[i+2:], x.runs[i+1:])
	x.runs[i+1] = right
}

// insertRef inserts v at j; a full run grows by a quarter, never past
// idChunk (roomInRun).
func insertRef(r []keyRef, j int, v keyRef) []keyRef {
	return slices.Insert(roomInRun(r), j, v)
}

// drop counts one record fewer with key, forgetting the key at zero.
func (x *keyIndex) drop(key string) {
	if len(x.runs) == 0 {
		return
	}
	i, j, found := x.find(key)
	if !found {
		return
	}
	r := x.runs[i]
	if r[j].n--; r[j].n > 0 {
		return
	}
	x.n--
	if j < len(r)/2 {
		copy(r[1:j+1], r[:j])
		r[0] = keyRef{}
		r = r[1:]
	} else {
		copy(r[j:], r[j+1:])
		r[len(r)-1] = keyRef{}
		r = r[:len(r)-1]
	}
	switch {
	case len(r) == 0:
		x.runs = append(x.runs[:i], x.runs[i+1:]...)
		if len(x.runs) == 0 {
			x.runs = nil
		}
		return
	case i+1 < len(x.runs) && len(r)+len(x.runs[i+1]) <= idChunk/2:
		x.runs[i] = append(clipRun(r, len(x.runs[i+1])), x.runs[i+1]...)
		x.runs = append(x.runs[:i+1], x.runs[i+2:]...)
	case i > 0 && len(r)+len(x.runs[i-1]) <= idChunk/2:
		x.runs[i-1] = append(clipRun(x.runs[i-1], len(r)), r...)
		x.runs = append(x.runs[:i], x.runs[i+1:]...)
	case cap(r) >= 4*len(r)+16:
		x.runs[i] = clipRun(r, 0)
	default:
		x.runs[i] = r
	}
}

// ascend calls fn for each key greater than after, in order, until fn
// returns false. fn must not change the index.
func (x *keyIndex) ascend(after string, fn func(key string) bool) {
	i := sort.Search(len(x.runs), func(i int) bool {
		r := x.runs[i]
		return r[len(r)-1].key > after
	})
	for k := i; k < len(x.runs); k++ {
		r := x.runs[k]
		if k == i {
			r = r[sort.Search(len(r), func(j int) bool { return r[j].key > after }):]
		}
		for _, e := range r {
			if !fn(e.key) {
				return
			}
		}
	}
}

// fromSorted replaces the contents with the keys of refs, sorted and
// distinct, in runs three quarters full.
func (x *keyIndex) fromSorted(refs []keyRef) {
	const size = idChunk * 3 / 4
	x.runs, x.n = nil, len(refs)
	if len(refs) == 0 {
		return
	}
	x.runs = make([][]keyRef, 0, (len(refs)+size-1)/size)
	for i := 0; i < len(refs); i += size {
		x.runs = append(x.runs, clipRun(refs[i:min(i+size, len(refs))], 0))
	}
}
