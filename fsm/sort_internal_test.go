package fsm

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// sortByName sorts like slices.Sort, zero bytes, prefixes and all.
func TestSortByName(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		var xs []string
		seen := map[string]bool{}
		n := r.IntN(60)
		alpha := "ab\x00c"
		for len(xs) < n {
			var b strings.Builder
			b.WriteString(strings.Repeat("p", round%3))
			for range r.IntN(12) {
				b.WriteByte(alpha[r.IntN(len(alpha))])
			}
			if s := b.String(); !seen[s] {
				seen[s] = true
				xs = append(xs, s)
			}
		}
		want := slices.Clone(xs)
		slices.Sort(want)
		sortByName(xs, func(s *string) string { return *s })
		if !slices.Equal(xs, want) {
			t.Fatalf("round %d:\n%q\n%q", round, xs, want)
		}
	}
}
