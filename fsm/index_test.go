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
			var got []string
			x.ascend(after, func(id string) bool { got = append(got, id); return true })
			var exp []string
			for _, id := range want {
				if id > after {
					exp = append(exp, id)
				}
			}
			if !slices.Equal(got, exp) {
				t.Fatalf("step %d after %q: got %d ids, want %d", i, after, len(got), len(exp))
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
