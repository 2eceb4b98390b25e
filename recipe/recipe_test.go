package recipe_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/recipe/embedded"
)

// TestLockWaitsPastTheServersCap: Lock waits longer than one wait_ms may
// last, on a server whose cap (1.5 s) is below MaxWait, by asking again.
func TestLockWaitsPastTheServersCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.MaxWait = 1500 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	b := embedded.New(n)
	s1, s2 := newSession(t, b, "one", 10*time.Second), newSession(t, b, "two", 10*time.Second)
	m1, m2 := recipe.NewMutex(s1, "k"), recipe.NewMutex(s2, "k")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx) }()
	// What is checked is that m2.Lock does not return while m1 holds the
	// lock, for more than two of the server's waits.
	time.Sleep(4 * time.Second)
	select {
	case err := <-got:
		t.Fatalf("m2.Lock returned %v while m1 held the lock", err)
	default:
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("m2.Lock: %v", err)
	}
	if m2.Token() <= 0 {
		t.Error("no fencing token")
	}
}
