package client

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestFenceGuardOrdering(t *testing.T) {
	var g FenceGuard
	if _, ok := g.Highest("a"); ok {
		t.Fatal("empty guard remembers a key")
	}
	for _, step := range []struct {
		key     string
		token   uint64
		highest uint64 // 0: accepted
	}{
		{"a", 5, 0},
		{"a", 5, 0}, // equal: the same holder again
		{"a", 4, 5},
		{"b", 1, 0}, // keys are independent
		{"a", 9, 0},
		{"a", 5, 9},
		{"b", 1, 0},
	} {
		err := g.Check(step.key, step.token)
		if step.highest == 0 {
			if err != nil {
				t.Fatalf("Check(%s, %d) = %v, want accepted", step.key, step.token, err)
			}
			continue
		}
		var se *StaleTokenError
		if !errors.As(err, &se) || !errors.Is(err, ErrStaleToken) {
			t.Fatalf("Check(%s, %d) = %v, want a stale token error", step.key, step.token, err)
		}
		if se.Key != step.key || se.Token != step.token || se.Highest != step.highest {
			t.Errorf("error %+v, want highest %d", se, step.highest)
		}
	}
	if h, ok := g.Highest("a"); !ok || h != 9 {
		t.Errorf("Highest(a) = %d, %v", h, ok)
	}
	g.Observe("a", 7) // lower: changes nothing
	g.Observe("b", 20)
	if h, _ := g.Highest("a"); h != 9 {
		t.Errorf("Observe lowered a to %d", h)
	}
	if err := g.Check("b", 19); !errors.Is(err, ErrStaleToken) {
		t.Errorf("Check(b, 19) after Observe(b, 20) = %v", err)
	}
}

func TestFenceGuardBounded(t *testing.T) {
	g := NewFenceGuard(2)
	mustCheck := func(key string, token uint64, wantOK bool) {
		t.Helper()
		err := g.Check(key, token)
		if (err == nil) != wantOK {
			t.Fatalf("Check(%s, %d) = %v, want accepted %v", key, token, err, wantOK)
		}
	}
	mustCheck("a", 10, true)
	mustCheck("b", 20, true)
	mustCheck("a", 10, true) // b is now the least recently checked
	mustCheck("c", 5, true)  // forgets b: the floor becomes 20
	if h, ok := g.Highest("b"); ok || h != 20 {
		t.Errorf("Highest(b) = %d, %v; want floor 20, forgotten", h, ok)
	}
	mustCheck("b", 19, false) // never lets a stale token through
	mustCheck("c", 5, true)   // c was remembered with its own token
	mustCheck("b", 20, true)  // forgets a
	mustCheck("a", 10, false) // the documented cost: refused, must re-acquire
	mustCheck("a", 21, true)
	if n := g.lru.Len(); n != 2 || len(g.keys) != 2 {
		t.Errorf("remembers %d keys (%d in the map), bound 2", n, len(g.keys))
	}
}

func TestFenceGuardConcurrent(t *testing.T) {
	g := NewFenceGuard(16)
	const workers, rounds = 8, 2000
	var wg sync.WaitGroup
	maxes := make([]uint64, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lastHighest uint64
			for range rounds {
				tok := rand.Uint64N(1 << 20)
				maxes[w] = max(maxes[w], tok)
				err := g.Check("shared", tok)
				if err == nil {
					continue
				}
				var se *StaleTokenError
				if !errors.As(err, &se) || se.Highest <= tok {
					t.Errorf("refused %d with %v", tok, err)
					return
				}
				// What one goroutine sees of the highest never goes down.
				if se.Highest < lastHighest {
					t.Errorf("highest went down from %d to %d", lastHighest, se.Highest)
					return
				}
				lastHighest = se.Highest
				// Unrelated keys churn the bounded guard meanwhile.
				g.Observe(string(rune('a'+rand.IntN(20))), tok)
			}
		}()
	}
	wg.Wait()
	var want uint64
	for _, m := range maxes {
		want = max(want, m)
	}
	// The highest token checked is never refused; nothing can go beyond it.
	h, _ := g.Highest("shared")
	if err := g.Check("shared", want); err != nil || h > want {
		t.Errorf("highest %d, max checked %d, Check(max) = %v", h, want, err)
	}
}
