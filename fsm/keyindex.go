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

// keyRun is one run of a keyIndex: keys sorted, ns[i] the count of
// keys[i]. Kept side by side rather than as []keyRef, whose 4-byte count
// would pad each entry to 24 bytes instead of 20.
type keyRun struct {
	keys []string
	ns   []int32
}

func (r *keyRun) len() int        { return len(r.keys) }
func (r *keyRun) last() string    { return r.keys[len(r.keys)-1] }
func (r *keyRun) at(j int) keyRef { return keyRef{r.keys[j], r.ns[j]} }

// insert puts v at j; a full run grows by a quarter, never past idChunk
// (roomInRun).
func (r *keyRun) insert(j int, v keyRef) {
	r.keys = slices.Insert(roomInRun(r.keys), j, v.key)
	r.ns = slices.Insert(roomInRun(r.ns), j, v.n)
}

// clip copies r into a new run with room for extra more entries.
func (r keyRun) clip(extra int) keyRun {
	return keyRun{keys: clipRun(r.keys, extra), ns: clipRun(r.ns, extra)}
}

// slice is r's entries i..j (sharing r's arrays).
func (r keyRun) slice(i, j int) keyRun { return keyRun{keys: r.keys[i:j], ns: r.ns[i:j]} }

// appendRun appends o's entries to r.
func (r keyRun) appendRun(o keyRun) keyRun {
	return keyRun{keys: append(r.keys, o.keys...), ns: append(r.ns, o.ns...)}
}

// keyIndex is the ordered set of the keys that lease records have, each
// with its count of records, in sorted runs of at most idChunk like idIndex
// (far smaller than a map of counts). Finding a key is a binary search.
type keyIndex struct {
	runs []keyRun // sorted by key, none empty
	n    int
}

// find returns the run where key is or would go and its position in it.
func (x *keyIndex) find(key string) (i, j int, found bool) {
	i = sort.Search(len(x.runs), func(i int) bool { return x.runs[i].last() >= key })
	i = min(i, len(x.runs)-1)
	r := x.runs[i].keys
	j = sort.Search(len(r), func(j int) bool { return r[j] >= key })
	return i, j, j < len(r) && r[j] == key
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
	return x.runs[i].ns[j]
}

// add counts one more record with key.
func (x *keyIndex) add(key string) {
	if len(x.runs) == 0 {
		x.runs = []keyRun{{keys: []string{key}, ns: []int32{1}}}
		x.n = 1
		return
	}
	if last := &x.runs[len(x.runs)-1]; key > last.last() {
		x.n++
		if last.len() < idChunk {
			last.keys, last.ns = append(last.keys, key), append(last.ns, 1)
		} else {
			x.runs = append(x.runs, keyRun{keys: append(make([]string, 0, 8), key), ns: append(make([]int32, 0, 8), 1)})
		}
		return
	}
	i, j, found := x.find(key)
	r := &x.runs[i]
	if found {
		r.ns[j]++
		return
	}
	x.n++
	if r.len() < idChunk {
		r.insert(j, keyRef{key, 1})
		return
	}
	h := r.len() / 2
	left, right := r.slice(0, h).clip(1), r.slice(h, r.len()).clip(1)
	if j <= h {
		left.insert(j, keyRef{key, 1})
	} else {
		right.insert(j-h, keyRef{key, 1})
	}
	x.runs[i] = left
	x.runs = slices.Insert(x.runs, i+1, right)
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
	if r.ns[j]--; r.ns[j] > 0 {
		return
	}
	x.n--
	if j < r.len()/2 {
		copy(r.keys[1:j+1], r.keys[:j])
		copy(r.ns[1:j+1], r.ns[:j])
		r.keys[0], r.ns[0] = "", 0
		r = r.slice(1, r.len())
	} else {
		copy(r.keys[j:], r.keys[j+1:])
		copy(r.ns[j:], r.ns[j+1:])
		r.keys[r.len()-1], r.ns[r.len()-1] = "", 0
		r = r.slice(0, r.len()-1)
	}
	switch {
	case r.len() == 0:
		x.runs = slices.Delete(x.runs, i, i+1)
		if len(x.runs) == 0 {
			x.runs = nil
		}
		return
	case i+1 < len(x.runs) && r.len()+x.runs[i+1].len() <= idChunk/2:
		x.runs[i] = r.clip(x.runs[i+1].len()).appendRun(x.runs[i+1])
		x.runs = slices.Delete(x.runs, i+1, i+2)
	case i > 0 && r.len()+x.runs[i-1].len() <= idChunk/2:
		x.runs[i-1] = x.runs[i-1].clip(r.len()).appendRun(r)
		x.runs = slices.Delete(x.runs, i, i+1)
	case cap(r.keys) >= 4*r.len()+16:
		x.runs[i] = r.clip(0)
	default:
		x.runs[i] = r
	}
}

// ascend calls fn for each key greater than after, in order, until fn
// returns false. fn must not change the index.
func (x *keyIndex) ascend(after string, fn func(key string) bool) {
	i := sort.Search(len(x.runs), func(i int) bool { return x.runs[i].last() > after })
	for k := i; k < len(x.runs); k++ {
		r := x.runs[k].keys
		if k == i {
			r = r[sort.Search(len(r), func(j int) bool { return r[j] > after }):]
		}
		for _, key := range r {
			if !fn(key) {
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
	x.runs = make([]keyRun, 0, (len(refs)+size-1)/size)
	for i := 0; i < len(refs); i += size {
		part := refs[i:min(i+size, len(refs))]
		r := keyRun{keys: make([]string, len(part)), ns: make([]int32, len(part))}
		for j, e := range part {
			r.keys[j], r.ns[j] = e.key, e.n
		}
		x.runs = append(x.runs, r)
	}
}
