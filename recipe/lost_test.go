package recipe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

// waitLost waits, up to 60 s, for a loss signal.
func waitLost(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: the loss was never signalled", what)
	}
}

func notLost(t *testing.T, what string, ch <-chan struct{}, err error) {
	t.Helper()
	select {
	case <-ch:
		t.Errorf("%s: lost (%v) while still held", what, err)
	default:
		if err != nil {
			t.Errorf("%s: LostErr %v while held", what, err)
		}
	}
}

func wantLost(t *testing.T, what string, err error, code wire.Code) {
	t.Helper()
	if !errors.Is(err, recipe.ErrLost) || (code != "" && wire.ErrorCode(err) != code) {
		t.Errorf("%s: LostErr %v, want ErrLost with %s", what, err, code)
	}
}

// TestLostSignalledOnRevoke runs on a real three-server cluster through the
// client: an operator's revoke of the lease of a Mutex, a Semaphore slot
// and an Election closes each one's Lost, and only its own, though the
// session (and its Done) lives on; the server ending the session (a
// holder's crash recovery) and the session lost on the client close Lost
// too; Unlock closes it with ErrUnlocked; a Lock after a loss locks anew.
func TestLostSignalledOnRevoke(t *testing.T) {
	ms := testcluster.Start(t, apiHandler)
	c := clusterClient(t, ms)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const ttl = 20 * time.Second
	revoke := func(id string) {
		retry(t, "revoke "+id, func(ctx context.Context) error {
			_, err := c.Revoke(ctx, id, "operator (test)")
			return err
		}, wire.CodeLeaseRevoked)
	}

	s := newSession(t, c, "lost-a", ttl)
	never := recipe.NewMutex(s, "lost/never")
	waitLost(t, "a mutex never locked", never.Lost())
	if err := never.LostErr(); !errors.Is(err, recipe.ErrNotHeld) {
		t.Errorf("never locked: LostErr %v, want ErrNotHeld", err)
	}

	m := recipe.NewMutex(s, "lost/mutex")
	sem := recipe.NewSemaphore(s, "lost/sem", 2)
	e := recipe.NewElection(s, "lost/elect")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sem.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Campaign(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	notLost(t, "mutex", m.Lost(), m.LostErr())

	revoke(m.Lease().LeaseID)
	waitLost(t, "revoked mutex", m.Lost())
	wantLost(t, "revoked mutex", m.LostErr(), wire.CodeLeaseRevoked)
	notLost(t, "semaphore", sem.Lost(), sem.LostErr())
	notLost(t, "election", e.Lost(), e.LostErr())
	notLost(t, "session", m.Done(), s.Err())

	revoke(sem.Lease().LeaseID)
	waitLost(t, "revoked semaphore", sem.Lost())
	wantLost(t, "revoked semaphore", sem.LostErr(), wire.CodeLeaseRevoked)
	if !e.IsLeader() {
		t.Error("not leader before the revoke")
	}
	ld, err := e.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	revoke(ld.LeaseID)
	waitLost(t, "revoked election", e.Lost())
	wantLost(t, "revoked election", e.LostErr(), wire.CodeLeaseRevoked)
	if e.IsLeader() {
		t.Error("IsLeader after the leadership was revoked")
	}
	notLost(t, "session", s.Done(), s.Err())

	// A Lock after the loss takes the lock anew; Unlock is no loss.
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("Lock after a loss: %v", err)
	}
	notLost(t, "relocked mutex", m.Lost(), m.LostErr())
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitLost(t, "unlocked mutex", m.Lost())
	if err := m.LostErr(); !errors.Is(err, recipe.ErrUnlocked) {
		t.Errorf("after Unlock: LostErr %v, want ErrUnlocked", err)
	}

	// The server ends the session (an operator's crash recovery of the
	// holder): the lock is lost before the next heartbeat could tell.
	s2 := newSession(t, c, "lost-b", ttl)
	m2 := recipe.NewMutex(s2, "lost/mutex2")
	if err := m2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	retry(t, "release holder", func(ctx context.Context) error {
		_, err := c.ReleaseHolder(ctx, "lost-b", "crash recovery (test)")
		return err
	})
	waitLost(t, "mutex of an ended session", m2.Lost())
	wantLost(t, "mutex of an ended session", m2.LostErr(), "")

	// The session lost on the client: Lost closes with Done.
	s3 := newSession(t, c, "lost-c", ttl)
	e3 := recipe.NewElection(s3, "lost/elect3")
	if err := e3.Campaign(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	s3.Orphan()
	waitLost(t, "election of a lost session", e3.Lost())
	if err := e3.LostErr(); !errors.Is(err, recipe.ErrLost) || !errors.Is(err, recipe.ErrSessionLost) {
		t.Errorf("election of a lost session: LostErr %v, want ErrLost and ErrSessionLost", err)
	}
}

// TestLostSignalledEmbedded: the same signal on an embedded node, for a
// revoke and for the session's end.
func TestLostSignalledEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	n, b := openEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newSession(t, b, "emb", 30*time.Second)
	m := recipe.NewMutex(s, "k")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Revoke(ctx, m.Lease().LeaseID, "test"); err != nil {
		t.Fatal(err)
	}
	waitLost(t, "revoked mutex", m.Lost())
	wantLost(t, "revoked mutex", m.LostErr(), wire.CodeLeaseRevoked)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitLost(t, "mutex of a closed session", m.Lost())
	wantLost(t, "mutex of a closed session", m.LostErr(), "")
}

// noStream is a backend whose event stream never opens.
type noStream struct{ recipe.Backend }

func (noStream) Watch(context.Context, client.WatchOptions, func(wire.Event) error) error {
	return &wire.Error{Code: wire.CodeUnavailable, Message: "no event stream (test)"}
}

// TestLostSignalledWithoutStream: when the event stream cannot be opened,
// the session's leases are read back between attempts, and a revoke is
// still signalled.
func TestLostSignalledWithoutStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	n, b := openEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newSession(t, noStream{b}, "nostream", 30*time.Second)
	m := recipe.NewMutex(s, "k")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	notLost(t, "mutex", m.Lost(), m.LostErr())
	if _, err := n.Revoke(ctx, m.Lease().LeaseID, "test"); err != nil {
		t.Fatal(err)
	}
	waitLost(t, "revoked mutex", m.Lost())
	wantLost(t, "revoked mutex", m.LostErr(), wire.CodeLeaseRevoked)
}
