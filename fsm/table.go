package fsm

import (
	"hash/maphash"
	"iter"
	"slices"
)

// named is what a table holds: a pointer to a record that carries its own
// name (a lease's id, a key's name).
type named interface {
	comparable
	tableName() string
}

// table is a hash set of records found by their name, in place of a
// map[string]*T, which stores each name's string header beside the pointer:
// the table stores the pointer and a byte of hash (9 bytes a slot) and
// reads the name from the record. Each lookup that finds its slot's hash
// byte reads that one record.
//
// It grows as Go's maps do, one small part at a time (extendible hashing):
// a directory, indexed by the hash's top bits, points to sub-tables of at
// most subMax slots with linear probing, and a full sub-table splits in
// two. No insert rehashes more than subMax entries, so a large table never
// stalls the state machine doubling as a whole.
//
// Iteration order depends on a random seed, as a map's does, so nothing
// that must be identical on every replica may depend on it. A table must not
// change while it is iterated. Copying a table shares its sub-tables: only
// one of the copies may be used afterwards.
type table[P named] struct {
	seed  maphash.Seed
	dir   []*subTable[P] // 1<<depth entries; a sub-table of depth d fills 1<<(depth-d) of them
	depth uint8
	n     int
}

// subTable is a linear-probing table of a power-of-two size. tags[i] is 0
// for an empty slot, else tagOf(the hash of slots[i]'s name).
type subTable[P named] struct {
	depth uint8 // the hash's top bits all its entries share
	n     int
	tags  []uint8
	slots []P
}

const (
	subMin = 8
	subMax = 1024
)

func newTable[P named]() table[P] {
	return table[P]{seed: maphash.MakeSeed(), dir: []*subTable[P]{newSubTable[P](0, subMin)}}
}

func newSubTable[P named](depth uint8, size int) *subTable[P] {
	return &subTable[P]{depth: depth, tags: make([]uint8, size), slots: make([]P, size)}
}

func (t *table[P]) hash(name string) uint64 { return maphash.String(t.seed, name) }

// tagOf is a slot's hash byte: bits the directory (the top ones) and the
// slot's position (the low ones) do not use, with the high bit set.
func tagOf(h uint64) uint8 { return uint8(h>>32) | 0x80 }

// sub is the sub-table for hash h.
func (t *table[P]) sub(h uint64) *subTable[P] {
	if t.depth == 0 {
		return t.dir[0]
	}
	return t.dir[h>>(64-t.depth)]
}

// find returns the slot of name in s and whether it is there; when it is
// not, the slot is the empty one where it would go.
func (s *subTable[P]) find(h uint64, name string) (int, bool) {
	mask := len(s.slots) - 1
	tag := tagOf(h)
	for i := int(h) & mask; ; i = (i + 1) & mask {
		switch s.tags[i] {
		case 0:
			return i, false
		case tag:
			if s.slots[i].tableName() == name {
				return i, true
			}
		}
	}
}

// Len is the number of records.
func (t *table[P]) Len() int { return t.n }

// Get returns the record named name, or the zero P.
func (t *table[P]) Get(name string) P {
	h := t.hash(name)
	s := t.sub(h)
	if i, ok := s.find(h, name); ok {
		return s.slots[i]
	}
	var zero P
	return zero
}

// Has reports whether a record is named name.
func (t *table[P]) Has(name string) bool {
	h := t.hash(name)
	_, ok := t.sub(h).find(h, name)
	return ok
}

// Put stores p, replacing the record of the same name if there is one.
func (t *table[P]) Put(p P) {
	name := p.tableName()
	h := t.hash(name)
	for {
		s := t.sub(h)
		i, ok := s.find(h, name)
		if ok {
			s.slots[i] = p
			return
		}
		if (s.n+1)*4 <= len(s.slots)*3 {
			s.tags[i], s.slots[i] = tagOf(h), p
			s.n++
			t.n++
			return
		}
		t.grow(s, h)
	}
}

// grow makes room in s, the sub-table for hash h: it doubles a sub-table
// smaller than subMax and splits one of subMax in two.
func (t *table[P]) grow(s *subTable[P], h uint64) {
	if len(s.slots) < subMax {
		bigger := newSubTable[P](s.depth, 2*len(s.slots))
		t.rehash(s, func(uint64) *subTable[P] { return bigger })
		*s = *bigger
		return
	}
	if s.depth == t.depth {
		dir := make([]*subTable[P], 2*len(t.dir))
		for i, x := range t.dir {
			dir[2*i], dir[2*i+1] = x, x
		}
		t.dir = dir
		t.depth++
	}
	lo, hi := newSubTable[P](s.depth+1, subMax), newSubTable[P](s.depth+1, subMax)
	bit := uint64(1) << (63 - s.depth)
	t.rehash(s, func(h uint64) *subTable[P] {
		if h&bit != 0 {
			return hi
		}
		return lo
	})
	// The directory entries of s are a run of 1<<(t.depth-s.depth) that
	// the new bit cuts in half.
	width := 1 << (t.depth - s.depth)
	start := int(h>>(64-t.depth)) &^ (width - 1)
	for i := range width {
		if i < width/2 {
			t.dir[start+i] = lo
		} else {
			t.dir[start+i] = hi
		}
	}
}

// rehash inserts the records of s into the sub-tables to picks for their
// hashes.
func (t *table[P]) rehash(s *subTable[P], to func(h uint64) *subTable[P]) {
	for i, tag := range s.tags {
		if tag == 0 {
			continue
		}
		p := s.slots[i]
		h := t.hash(p.tableName())
		d := to(h)
		mask := len(d.slots) - 1
		j := int(h) & mask
		for d.tags[j] != 0 {
			j = (j + 1) & mask
		}
		d.tags[j], d.slots[j] = tagOf(h), p
		d.n++
	}
}

// Delete removes the record named name, if there is one.
func (t *table[P]) Delete(name string) {
	h := t.hash(name)
	s := t.sub(h)
	i, ok := s.find(h, name)
	if !ok {
		return
	}
	// Backward-shift deletion: move up each later record of the probe run
	// whose home slot is not between the hole and it, so that no lookup
	// meets an empty slot before its record.
	mask := len(s.slots) - 1
	for j := (i + 1) & mask; s.tags[j] != 0; j = (j + 1) & mask {
		home := int(t.hash(s.slots[j].tableName())) & mask
		if (j-home)&mask >= (j-i)&mask {
			s.tags[i], s.slots[i] = s.tags[j], s.slots[j]
			i = j
		}
	}
	var zero P
	s.tags[i], s.slots[i] = 0, zero
	s.n--
	t.n--
}

// All yields every record, in an order that depends on the table's seed.
func (t *table[P]) All() iter.Seq[P] {
	return func(yield func(P) bool) {
		for i := 0; i < len(t.dir); {
			s := t.dir[i]
			for j, tag := range s.tags {
				if tag != 0 && !yield(s.slots[j]) {
					return
				}
			}
			i += 1 << (t.depth - s.depth)
		}
	}
}

// sortedNames returns the names of every record, sorted.
func (t *table[P]) sortedNames() []string {
	out := make([]string, 0, t.n)
	for p := range t.All() {
		out = append(out, p.tableName())
	}
	slices.Sort(out)
	return out
}

// reserve sizes an empty table for n records, so that filling it (a
// restore) splits nothing: as many sub-tables of subMax slots as a power of
// two needs for each to expect at most subMax/2 records (two thirds of its
// load limit).
func (t *table[P]) reserve(n int) {
	if t.n != 0 {
		return
	}
	if n*4 <= subMax*3 {
		size := subMin
		for size*3 < n*4 {
			size *= 2
		}
		t.dir, t.depth = []*subTable[P]{newSubTable[P](0, size)}, 0
		return
	}
	depth := uint8(0)
	for (1<<depth)*subMax/2 < n {
		depth++
	}
	t.dir, t.depth = make([]*subTable[P], 1<<depth), depth
	for i := range t.dir {
		t.dir[i] = newSubTable[P](depth, subMax)
	}
}
