package recipe_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

// leaderless answers acquires NO_LEADER, its first failLists listings
// UNAVAILABLE and the others with no lease (which is the truth: no
// acquire succeeds). The listings never reach the node, so the retries
// are exactly failLists: a real read can fail too on a loaded machine
// (CI once saw the observer retry hundreds of times, the test's jitter
// source answering every wait with none).
type leaderless struct {
	recipe.Backend
	mu        sync.Mutex
	failLists int
}

func (b *leaderless) Acquire(context.Context, wire.AcquireRequest) (*wire.Lease, error) {
	return nil, &wire.Error{Code: wire.CodeNoLeader, Message: "no leader (test)"}
}

func (b *leaderless) List(ctx context.Context, req wire.ListRequest) (*wire.LeaseList, error) {
	b.mu.Lock()
	fail := b.failLists > 0
	b.failLists--
	b.mu.Unlock()
	if fail {
		return nil, &wire.Error{Code: wire.CodeUnavailable, Message: "unreachable (test)"}
	}
	return &wire.LeaseList{}, nil
}

// ceilings records the windows the backoffs draw from and answers the
// bottom of each (no waiting).
type ceilings struct {
	mu  sync.Mutex
	got []time.Duration
}

func (c *ceilings) rand(n int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, time.Duration(n-1))
	return 0
}

func (c *ceilings) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.got)
}

// TestRecipeRetriesJittered: a lock retried across NO_LEADER and an
// observer retrying its read back off with full jitter, from windows of
// 50 ms doubling (up to 2 s), not after the same fixed delays everywhere.
func TestRecipeRetriesJittered(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, b := openEmbedded(t)
	f := &leaderless{Backend: b, failLists: 3}
	s := newSession(t, f, "me", 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var c ceilings
	recipe.SetBackoffRand(t, c.rand)
	if err := recipe.NewMutex(s, "k").TryLock(ctx); wire.ErrorCode(err) != wire.CodeNoLeader {
		t.Fatalf("TryLock: %v, want NO_LEADER", err)
	}
	if got, want := c.String(), "[50ms 100ms 200ms]"; got != want {
		t.Errorf("TryLock's retry windows %s, want %s", got, want)
	}

	c = ceilings{}
	octx, ocancel := context.WithCancel(ctx)
	obs := recipe.Observe(octx, f, "k")
	select {
	case ld := <-obs:
		if ld != nil {
			t.Errorf("observed %+v, want nobody", ld)
		}
	case <-ctx.Done():
		t.Fatal("nothing observed")
	}
	ocancel()
	for range obs { // the observer has stopped before the source is reset
	}
	if got, want := c.String(), "[50ms 100ms 200ms]"; got != want {
		t.Errorf("Observe's retry windows %s, want %s", got, want)
	}
}
