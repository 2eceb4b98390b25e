package fsm

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

type tRec struct {
	name string
	v    int
}

func (r *tRec) tableName() string { return r.name }

// checkTable compares t with the model m record by record, and checks the
// table's own invariants: counts, the directory, every record reachable by
// its probe run.
func checkTable(t *testing.T, tb *table[*tRec], m map[string]*tRec) {
	t.Helper()
	if tb.Len() != len(m) {
		t.Fatalf("Len %d, model %d", tb.Len(), len(m))
	}
	seen := map[string]bool{}
	for r := range tb.All() {
		if seen[r.name] {
			t.Fatalf("All yields %q twice", r.name)
		}
		seen[r.name] = true
		if m[r.name] != r {
			t.Fatalf("All yields %q = %p, model %p", r.name, r, m[r.name])
		}
	}
	if len(seen) != len(m) {
		t.Fatalf("All yields %d records, model has %d", len(seen), len(m))
	}
	for name, r := range m {
		if got := tb.Get(name); got != r {
			t.Fatalf("Get(%q) = %v, want %v", name, got, r)
		}
	}
	total := 0
	for i := 0; i < len(tb.dir); {
		s := tb.dir[i]
		width := 1 << (tb.depth - s.depth)
		if i%width != 0 {
			t.Fatalf("sub-table of depth %d starts at %d, not a multiple of %d", s.depth, i, width)
		}
		n := 0
		for j := range width {
			if tb.dir[i+j] != s {
				t.Fatalf("directory entry %d is not the sub-table of depth %d at %d", i+j, s.depth, i)
			}
		}
		for j, tag := range s.tags {
			if tag == 0 {
				if s.slots[j] != nil {
					t.Fatalf("empty slot %d holds %v", j, s.slots[j])
				}
				continue
			}
			n++
			h := tb.hash(s.slots[j].name)
			if tagOf(h) != tag || tb.sub(h) != s {
				t.Fatalf("record %q in the wrong place", s.slots[j].name)
			}
		}
		if n != s.n || n*4 > len(s.slots)*3 {
			t.Fatalf("sub-table counts %d, holds %d in %d slots", s.n, n, len(s.slots))
		}
		total += n
		i += width
	}
	if total != tb.n {
		t.Fatalf("sub-tables hold %d, table counts %d", total, tb.n)
	}
}

func TestTableModel(t *testing.T) {
	for _, size := range []int{10, 300, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(size), 7))
			tb := newTable[*tRec]()
			m := map[string]*tRec{}
			for op := range 20 * size {
				name := fmt.Sprintf("k%d", rng.IntN(size))
				switch rng.IntN(4) {
				case 0, 1: // insert or replace
					r := &tRec{name: name, v: op}
					tb.Put(r)
					m[name] = r
				case 2:
					tb.Delete(name)
					delete(m, name)
				case 3:
					if got, want := tb.Get(name), m[name]; got != want {
						t.Fatalf("op %d: Get(%q) = %v, want %v", op, name, got, want)
					}
					if tb.Has(name) != (m[name] != nil) {
						t.Fatalf("op %d: Has(%q) wrong", op, name)
					}
				}
				if op%(size/2+1) == 0 {
					checkTable(t, &tb, m)
				}
			}
			checkTable(t, &tb, m)
			for name := range m {
				tb.Delete(name)
				delete(m, name)
			}
			checkTable(t, &tb, m)
		})
	}
}

// TestTableGrowsInParts fills a table far past one sub-table and checks
// that it split into sub-tables (none larger than subMax) rather than
// growing as a whole, then empties it.
func TestTableGrowsInParts(t *testing.T) {
	tb := newTable[*tRec]()
	m := map[string]*tRec{}
	for i := range 50_000 {
		r := &tRec{name: fmt.Sprintf("ls_%016x", i)}
		tb.Put(r)
		m[r.name] = r
	}
	checkTable(t, &tb, m)
	if tb.depth < 5 {
		t.Fatalf("directory depth %d for 50,000 records", tb.depth)
	}
	for _, s := range tb.dir {
		if len(s.slots) > subMax {
			t.Fatalf("a sub-table of %d slots", len(s.slots))
		}
	}
	for name := range m {
		tb.Delete(name)
	}
	if tb.Len() != 0 || tb.Get("ls_0000000000000000") != nil {
		t.Fatal("not empty after deleting all")
	}
}

func BenchmarkTableGet(b *testing.B) {
	const n = 1 << 20
	names := make([]string, n)
	tb := newTable[*tRec]()
	m := make(map[string]*tRec)
	for i := range names {
		names[i] = fmt.Sprintf("ls_%016x", rand.Uint64())
		r := &tRec{name: names[i]}
		tb.Put(r)
		m[names[i]] = r
	}
	b.Run("table", func(b *testing.B) {
		for i := range b.N {
			if tb.Get(names[i&(n-1)]) == nil {
				b.Fatal("missing")
			}
		}
	})
	b.Run("map", func(b *testing.B) {
		for i := range b.N {
			if m[names[i&(n-1)]] == nil {
				b.Fatal("missing")
			}
		}
	})
}

// TestTableReserve fills reserved tables of several sizes without a split
// or a sub-table's growth, and checks them against the model.
func TestTableReserve(t *testing.T) {
	for _, n := range []int{0, 1, 7, 700, 768, 769, 5000, 40_000} {
		tb := newTable[*tRec]()
		tb.reserve(n)
		depth, subs, size := tb.depth, len(tb.dir), len(tb.dir[0].slots)
		m := map[string]*tRec{}
		for i := range n {
			r := &tRec{name: fmt.Sprintf("k%d", i)}
			tb.Put(r)
			m[r.name] = r
		}
		checkTable(t, &tb, m)
		if tb.depth != depth || len(tb.dir) != subs || len(tb.dir[0].slots) != size {
			t.Fatalf("%d records: the reserved table grew (depth %d -> %d)", n, depth, tb.depth)
		}
	}
}

// TestTableDeleteWraps deletes, in every order, records whose probe run
// wraps from the end of a sub-table to its start: names are picked by their
// home slot (6, 7 or 0 of 8) under the table's seed.
func TestTableDeleteWraps(t *testing.T) {
	for round := range 50 {
		tb := newTable[*tRec]()
		homes := []int{6, 6, 7, 0, 7, 6}
		var recs []*tRec
		for i := 0; len(recs) < len(homes); i++ {
			name := fmt.Sprintf("w%d-%d", round, i)
			if int(tb.hash(name))&(subMin-1) == homes[len(recs)] {
				recs = append(recs, &tRec{name: name})
			}
		}
		m := map[string]*tRec{}
		for _, r := range recs {
			tb.Put(r)
			m[r.name] = r
		}
		if len(tb.dir) != 1 || len(tb.dir[0].slots) != subMin {
			t.Fatalf("6 records did not stay in one sub-table of %d slots", subMin)
		}
		checkTable(t, &tb, m)
		rng := rand.New(rand.NewPCG(uint64(round), 1))
		for _, i := range rng.Perm(len(recs)) {
			tb.Delete(recs[i].name)
			delete(m, recs[i].name)
			checkTable(t, &tb, m)
		}
	}
}
