package fsm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// nameOrder orders like slices.Sort, zero bytes, prefixes and all: small
// sets, sets large enough for every radix pass, names that share a long
// prefix or none, and first names that share more than the whole set does
// (the guessed prefix is then too long and must be redone).
func TestNameOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 400 {
		n := r.IntN(60)
		if round%4 == 3 {
			n = 1000 + r.IntN(4000)
		}
		prefix := strings.Repeat("p", round%3)
		alpha := "ab\x00c\xff"
		if round%5 == 4 {
			alpha = "0123456789abcdef"
		}
		var xs []string
		seen := map[string]bool{}
		for len(xs) < n {
			var b strings.Builder
			b.WriteString(prefix)
			if round%7 == 6 && len(xs) < 20 {
				// The first names share a longer prefix than the rest.
				b.WriteString("shared-prefix")
			}
			for range r.IntN(14) {
				b.WriteByte(alpha[r.IntN(len(alpha))])
			}
			if s := b.String(); !seen[s] {
				seen[s] = true
				xs = append(xs, s)
			}
		}
		want := slices.Clone(xs)
		slices.Sort(want)
		order := nameOrder(xs, func(s *string) string { return *s }, &radixScratch{})
		if len(order) != len(xs) {
			t.Fatalf("round %d: order of %d for %d names", round, len(order), len(xs))
		}
		got := make([]string, len(order))
		for j, i := range order {
			got[j] = xs[i]
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d:\n%q\n%q", round, got, want)
		}
	}
}

// BenchmarkNameOrder orders a million leases by id, as a snapshot does:
// random ids ("ls_" and 16 hex digits), records in no particular order.
func BenchmarkNameOrder(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	ls := make([]*Lease, 1_000_000)
	for i := range ls {
		ls[i] = &Lease{ID: fmt.Sprintf("ls_%016x", r.Uint64())}
	}
	r.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
	var sc radixScratch
	for b.Loop() {
		nameOrder(ls, func(l **Lease) string { return (*l).ID }, &sc)
	}
}
