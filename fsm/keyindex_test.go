package fsm

import (
	"bytes"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// TestKeyIndexMatchesCountedSet checks the key index against a map of
// counts through adds and drops that split and merge runs.
func TestKeyIndexMatchesCountedSet(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	var x keyIndex
	counts := map[string]int32{}
	for i := range 20000 {
		k := fmt.Sprintf("camera/%04d", r.Intn(3000))
		if r.Intn(3) == 0 {
			x.drop(k)
			if counts[k]--; counts[k] <= 0 {
				delete(counts, k)
			}
		} else {
			x.add(k)
			counts[k]++
		}
		if i%500 != 0 {
			continue
		}
		if err := x.check(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := sortedKeys(counts)
		if x.n != len(want) {
			t.Fatalf("step %d: size %d, want %d", i, x.n, len(want))
		}
		for _, k := range []string{"camera/0000", "camera/1500", "camera/2999", "nope"} {
			if got := x.count(k); got != counts[k] {
				t.Fatalf("step %d: count(%s) = %d, want %d", i, k, got, counts[k])
			}
		}
		for _, after := range []string{"", "camera/0400", "camera/2999", "zz"} {
			var got, exp []string
			x.ascend(after, func(k string) bool { got = append(got, k); return true })
			for _, k := range want {
				if k > after {
					exp = append(exp, k)
				}
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("step %d after %q: got %d keys, want %d", i, after, len(got), len(exp))
			}
		}
	}
	var y keyIndex
	y.fromSorted(countRefs(counts))
	if err := y.check(); err != nil || y.n != x.n {
		t.Fatalf("fromSorted: %v, %d keys, want %d", err, y.n, x.n)
	}
	for k, n := range counts {
		if y.count(k) != n {
			t.Fatalf("fromSorted: count(%s) = %d, want %d", k, y.count(k), n)
		}
	}
}

func countRefs(counts map[string]int32) []keyRef {
	var refs []keyRef
	for _, k := range sortedKeys(counts) {
		refs = append(refs, keyRef{k, counts[k]})
	}
	return refs
}

// check verifies the shape of x: runs non-empty, at most idChunk long,
// keys strictly increasing, counts positive, n the number of keys.
func (x *keyIndex) check() error {
	n, prev := 0, ""
	for i, run := range x.runs {
		if run.len() == 0 || run.len() > idChunk || len(run.ns) != run.len() {
			return fmt.Errorf("run %d of %d keys, %d counts", i, run.len(), len(run.ns))
		}
		for j := range run.keys {
			e := run.at(j)
			if n > 0 && e.key <= prev || e.n <= 0 {
				return fmt.Errorf("run %d: key %q (count %d) after %q", i, e.key, e.n, prev)
			}
			prev = e.key
			n++
		}
	}
	if n != x.n {
		return fmt.Errorf("%d keys, n = %d", n, x.n)
	}
	return nil
}

// flatten lists the keys of x with their counts, in order.
func (x *keyIndex) flatten() []keyRef {
	var out []keyRef
	for _, r := range x.runs {
		for j := range r.keys {
			out = append(out, r.at(j))
		}
	}
	return out
}

// TestRestoreCountsKeys: a restore rebuilds the key index (keys of active
// and ended records, several records per key, keys with and without state)
// exactly as applying the log built it, and leaves no count behind in the
// key states.
func TestRestoreCountsKeys(t *testing.T) {
	f := New()
	idx := uint64(1)
	f.Apply(idx, &Tick{Tick: 1, PeriodMS: 100, RetainTicks: 1000})
	acquire := func(id, key string, limit uint32) {
		idx++
		res := f.Apply(idx, &Acquire{LeaseID: id, Key: key, Holder: "h", Limit: limit, TokenHash: HashOf(id), TTLMS: 10000, TTLTicks: 100})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	release := func(id string) {
		idx++
		if res := f.Apply(idx, &Release{LeaseID: id, TokenHash: HashOf(id)}); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	for i := range 600 {
		acquire(fmt.Sprintf("ls_%04d", i), fmt.Sprintf("k/%03d", i%300), 2)
	}
	for i := 0; i < 600; i += 3 {
		release(fmt.Sprintf("ls_%04d", i)) // some keys keep one lease, some none
	}
	acquire("ls_a", "a/only-ended", 1)
	release("ls_a")
	acquire("ls_z", "z/active", 1)
	acquire("ls_zz", "zz/ended", 1)
	release("ls_zz") // a key without state after the last key with state
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g := New()
	if err := g.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if err := g.keyIdx.check(); err != nil {
		t.Fatal(err)
	}
	if got, want := g.keyIdx.flatten(), f.keyIdx.flatten(); !slices.Equal(got, want) {
		t.Fatalf("restored key index has %d keys, applied %d:\n%v\n%v", len(got), len(want), got, want)
	}
	for ks := range g.keys.All() {
		k := ks.key
		if ks.refs != 0 {
			t.Fatalf("key %s keeps a count of %d", k, ks.refs)
		}
	}
}
