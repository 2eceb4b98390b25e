package recipe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/recipe/embedded"
	"github.com/leasehold/leasehold/wire"
)

// faulty is a backend whose next acquires or releases take effect but are
// answered INDETERMINATE (the answer lost on the way back), and which can
// run a hook between an acquire taking effect and its answer.
type faulty struct {
	recipe.Backend
	mu              sync.Mutex
	lostAcquires    int
	lostReleases    int
	afterAcquire    func(*wire.Lease)
	acquires        int
	releasesApplied int
}

var errLost = &wire.Error{Code: wire.CodeIndeterminate, Message: "answer lost (test)"}

func (f *faulty) Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, error) {
	l, err := f.Backend.Acquire(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acquires++
	if err == nil && f.afterAcquire != nil {
		hook := f.afterAcquire
		f.afterAcquire = nil
		hook(l)
	}
	if f.lostAcquires > 0 {
		f.lostAcquires--
		return nil, errLost
	}
	return l, err
}

func (f *faulty) Release(ctx context.Context, req wire.ReleaseRequest) (*wire.Lease, error) {
	l, err := f.Backend.Release(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		f.releasesApplied++
	}
	if f.lostReleases > 0 {
		f.lostReleases--
		return nil, errLost
	}
	return l, err
}

func openEmbedded(t *testing.T) (*node.Node, recipe.Backend) {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, embedded.New(n)
}

func activeOn(t *testing.T, n *node.Node, key string) []*wire.Lease {
	t.Helper()
	l, err := n.ListLeases(context.Background(), wire.ListRequest{Key: key, State: "active"}, false)
	if err != nil {
		t.Fatal(err)
	}
	return l.Leases
}

// TestRecipeLostAnswers: answers lost on the way back (INDETERMINATE) never
// leave a recipe believing the opposite of the truth, nor its own lease in
// its way.
func TestRecipeLostAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	n, b := openEmbedded(t)
	f := &faulty{Backend: b}
	s := newSession(t, f, "me", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("unlock whose answer was lost stays held until it is known", func(t *testing.T) {
		m := recipe.NewMutex(s, "unlock-lost")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		f.lostReleases = 1
		f.mu.Unlock()
		if err := m.Unlock(ctx); wire.ErrorCode(err) != wire.CodeIndeterminate {
			t.Fatalf("first unlock: %v, want INDETERMINATE", err)
		}
		if m.Token() == 0 {
			t.Fatal("the mutex forgot a lease whose release may not have applied")
		}
		// Asking again settles it: the release had applied.
		if err := m.Unlock(ctx); wire.ErrorCode(err) != wire.CodeLeaseReleased {
			t.Fatalf("second unlock: %v, want LEASE_RELEASED", err)
		}
		if m.Token() != 0 || len(activeOn(t, n, "unlock-lost")) != 0 {
			t.Fatal("still held after the release was known")
		}
		if err := m.LostErr(); !errors.Is(err, recipe.ErrUnlocked) {
			t.Errorf("LostErr %v, want ErrUnlocked: the release was the holder's own", err)
		}
	})

	t.Run("a retried lock whose lease ended meanwhile does not report it held", func(t *testing.T) {
		m := recipe.NewMutex(s, "revoked-between")
		f.mu.Lock()
		f.lostAcquires = 1
		f.afterAcquire = func(l *wire.Lease) {
			if _, err := n.Revoke(context.Background(), l.LeaseID, "test"); err != nil {
				t.Errorf("revoke: %v", err)
			}
		}
		f.mu.Unlock()
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		active := activeOn(t, n, "revoked-between")
		if len(active) != 1 || active[0].FencingToken != m.Token() {
			t.Fatalf("Lock returned holding token %d; active leases %+v", m.Token(), active)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a trylock given up after lost answers gives back what it got", func(t *testing.T) {
		m := recipe.NewMutex(s, "trylock-lost")
		f.mu.Lock()
		f.lostAcquires = 4 // every try TryLock makes
		f.mu.Unlock()
		if err := m.TryLock(ctx); wire.ErrorCode(err) != wire.CodeIndeterminate {
			t.Fatalf("TryLock: %v, want INDETERMINATE", err)
		}
		if got := activeOn(t, n, "trylock-lost"); len(got) != 0 {
			t.Fatalf("TryLock failed but left its lease active: %+v", got)
		}
		if err := m.TryLock(ctx); err != nil {
			t.Fatalf("TryLock after the lost answers: %v (its own lease in the way?)", err)
		}
		if errors.Is(m.Unlock(ctx), recipe.ErrNotHeld) {
			t.Fatal("not held")
		}
	})
}
