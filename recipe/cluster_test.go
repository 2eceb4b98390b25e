package recipe_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

// apiHandler serves the HTTP API of a test cluster's member.
func apiHandler(n *node.Node) http.Handler { return api.New(api.FromNode(n), api.Options{}) }

func clusterClient(t *testing.T, ms []*testcluster.Member) *client.Client {
	t.Helper()
	c, err := client.New(testcluster.Addrs(ms), client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newSession(t *testing.T, b recipe.Backend, holder string, ttl time.Duration) *recipe.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		s, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: holder, TTL: ttl})
		if err == nil {
			t.Cleanup(func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = s.Close(cctx)
			})
			return s
		}
		if ctx.Err() != nil {
			t.Fatalf("session for %s: %v", holder, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// retry runs op until it succeeds or answers with an error that ok accepts,
// up to 60 s: operations across a leader kill may fail while there is none.
func retry(t *testing.T, what string, op func(ctx context.Context) error, ok ...wire.Code) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		for _, c := range ok {
			if wire.ErrorCode(err) == c {
				return err
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// doneAt records when a Done channel closes.
type doneAt struct {
	mu sync.Mutex
	at time.Time
}

func watchDone(ch <-chan struct{}) *doneAt {
	d := &doneAt{}
	go func() {
		<-ch
		d.mu.Lock()
		d.at = time.Now()
		d.mu.Unlock()
	}()
	return d
}

func (d *doneAt) get() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// TestRecipesAcrossLeaderKill runs every recipe on a real three-server
// cluster through the client while the leader is killed: a Mutex and an
// Election with a waiter each, a Semaphore of two slots with a third
// waiter, and an observer of the election. Nobody is granted what another
// still relies on: a waiter gets the lock only after the holder let go
// (Unlock sent) or its session reported the loss; fencing tokens grow; the
// observer reports each leader.
func TestRecipesAcrossLeaderKill(t *testing.T) {
	ms := testcluster.Start(t, apiHandler)
	c := clusterClient(t, ms)
	bg := context.Background()
	const ttl = 20 * time.Second // generous: the failover must not cost the sessions

	// Mutex: m1 holds, m2 waits.
	s1, s2 := newSession(t, c, "m-one", ttl), newSession(t, c, "m-two", ttl)
	m1, m2 := recipe.NewMutex(s1, "mutex"), recipe.NewMutex(s2, "mutex")
	if err := m1.Lock(bg); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(bg); !errors.Is(err, recipe.ErrLocked) {
		t.Fatalf("TryLock on a held mutex: %v, want ErrLocked", err)
	}
	s1Done := watchDone(s1.Done())
	m2Got := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 120*time.Second)
		defer cancel()
		if err := m2.Lock(ctx); err != nil {
			t.Errorf("m2.Lock: %v", err)
			close(m2Got)
			return
		}
		m2Got <- time.Now()
	}()

	// Semaphore: two slots taken, a third waits.
	ss := []*recipe.Session{newSession(t, c, "sem-a", ttl), newSession(t, c, "sem-b", ttl), newSession(t, c, "sem-c", ttl)}
	sems := []*recipe.Semaphore{recipe.NewSemaphore(ss[0], "sem", 2), recipe.NewSemaphore(ss[1], "sem", 2), recipe.NewSemaphore(ss[2], "sem", 2)}
	for _, m := range sems[:2] {
		if err := m.Acquire(bg); err != nil {
			t.Fatal(err)
		}
	}
	if err := sems[2].TryAcquire(bg); !errors.Is(err, recipe.ErrLocked) {
		t.Fatalf("TryAcquire on a full semaphore: %v, want ErrLocked", err)
	}
	sem0Done := watchDone(ss[0].Done())
	sem2Got := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 120*time.Second)
		defer cancel()
		if err := sems[2].Acquire(ctx); err != nil {
			t.Errorf("third semaphore Acquire: %v", err)
			close(sem2Got)
			return
		}
		sem2Got <- time.Now()
	}()

	// Election: e1 leads with "a", e2 campaigns with "b", obs observes.
	es1, es2 := newSession(t, c, "e-one", ttl), newSession(t, c, "e-two", ttl)
	e1, e2 := recipe.NewElection(es1, "elect"), recipe.NewElection(es2, "elect")
	if err := e1.Campaign(bg, "a"); err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithCancel(bg)
	defer ocancel()
	obs := recipe.Observe(octx, c, "elect")
	if ld := <-obs; ld == nil || ld.Value != "a" || ld.FencingToken != e1.Token() {
		t.Fatalf("observed %+v, want leader a with token %d", ld, e1.Token())
	}
	e2Won := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 120*time.Second)
		defer cancel()
		e2Won <- e2.Campaign(ctx, "b")
	}()

	// Kill the leader.
	var leader *testcluster.Member
	testcluster.PollUntil(t, 60*time.Second, "a leader", func() bool { leader = testcluster.Leader(ms); return leader != nil })
	leader.Stop()
	var rest []*testcluster.Member
	for _, m := range ms {
		if m != leader {
			rest = append(rest, m)
		}
	}
	testcluster.PollUntil(t, 60*time.Second, "a new leader", func() bool { return testcluster.Leader(rest) != nil })

	// The holders let go, each across the failover.
	tok1 := m1.Token()
	m1Released := time.Now()
	retry(t, "m1.Unlock", m1.Unlock, wire.CodeLeaseReleased, wire.CodeLeaseExpired)
	var got time.Time
	select {
	case got = <-m2Got:
	case <-time.After(120 * time.Second):
		t.Fatal("m2 never got the mutex")
	}
	if got.IsZero() {
		t.FailNow()
	}
	if d := s1Done.get(); !got.After(m1Released) && (d.IsZero() || !got.After(d)) {
		t.Fatalf("m2 got the mutex at %v, before m1 let go (%v) or lost it (%v)", got, m1Released, d)
	}
	if m2.Token() <= tok1 {
		t.Errorf("fencing token went from %d to %d", tok1, m2.Token())
	}

	semTok := sems[0].Token()
	sem0Released := time.Now()
	retry(t, "semaphore Release", sems[0].Release, wire.CodeLeaseReleased, wire.CodeLeaseExpired)
	select {
	case got = <-sem2Got:
	case <-time.After(120 * time.Second):
		t.Fatal("the third semaphore holder never got a slot")
	}
	if got.IsZero() {
		t.FailNow()
	}
	if d := sem0Done.get(); !got.After(sem0Released) && (d.IsZero() || !got.After(d)) {
		t.Fatalf("third holder got a slot at %v, before the first let go (%v) or lost it (%v)", got, sem0Released, d)
	}
	if sems[2].Token() <= semTok {
		t.Errorf("semaphore fencing token went from %d to %d", semTok, sems[2].Token())
	}
	var active int
	retry(t, "list the semaphore", func(ctx context.Context) error {
		ls, err := c.List(ctx, wire.ListRequest{Key: "sem", State: "active"})
		if err == nil {
			active = len(ls.Leases)
		}
		return err
	})
	if active != 2 {
		t.Errorf("%d active leases on a semaphore of 2", active)
	}

	retry(t, "e1.Resign", e1.Resign, wire.CodeLeaseReleased, wire.CodeLeaseExpired)
	select {
	case err := <-e2Won:
		if err != nil {
			t.Fatalf("e2.Campaign: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("e2 never won")
	}
	// The observer reports b (perhaps after a report of nobody).
	deadline := time.After(60 * time.Second)
	for seen := false; !seen; {
		select {
		case ld, ok := <-obs:
			if !ok {
				t.Fatal("the observer stopped")
			}
			seen = ld != nil && ld.Value == "b" && ld.Holder == "e-two"
		case <-deadline:
			t.Fatal("the observer never reported b")
		}
	}
	var ld *recipe.Leader
	retry(t, "Leader", func(ctx context.Context) (err error) { ld, err = e1.Leader(ctx); return err })
	if ld.Value != "b" || ld.FencingToken != e2.Token() {
		t.Errorf("Leader = %+v, want b with token %d", ld, e2.Token())
	}

	// Every session survived the failover, and Close frees what it holds.
	for _, s := range []*recipe.Session{s1, s2, ss[0], ss[1], ss[2], es1, es2} {
		if err := s.Err(); err != nil {
			t.Errorf("session %s: %v", s.Holder(), err)
		}
	}
	retry(t, "close s2", s2.Close)
	if err := m2.Unlock(bg); err == nil {
		t.Error("Unlock after the session closed succeeded")
	}
	retry(t, "list the mutex", func(ctx context.Context) error {
		ls, err := c.List(ctx, wire.ListRequest{Key: "mutex", State: "active"})
		if err == nil && len(ls.Leases) != 0 {
			t.Errorf("mutex still held after its session closed: %+v", ls.Leases[0])
		}
		return err
	})
}

// TestSessionLossReportedBeforeExpiry: with every server gone the session
// cannot be renewed; Done closes, and Lock refuses, before the earliest
// instant the server could have ended it (the send time of the last
// heartbeat, which is before the servers stopped, plus the TTL).
func TestSessionLossReportedBeforeExpiry(t *testing.T) {
	ms := testcluster.Start(t, apiHandler)
	c := clusterClient(t, ms)
	const ttl = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var s *recipe.Session
	retry(t, "session", func(ctx context.Context) (err error) {
		// A margin of 3 s absorbs a loaded machine's scheduling delays.
		s, err = recipe.NewSession(ctx, c, recipe.SessionOptions{Holder: "h", TTL: ttl,
			KeepAlive: client.KeepAliveOptions{Margin: 3 * time.Second}})
		return err
	})
	m := recipe.NewMutex(s, "k")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for _, mb := range ms {
		mb.Stop()
	}
	select {
	case <-m.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the loss was never reported")
	}
	if lost := time.Now(); !lost.Before(stopped.Add(ttl)) {
		t.Fatalf("loss reported %v after the servers stopped, not before the TTL (%v)", lost.Sub(stopped), ttl)
	}
	if !errors.Is(s.Err(), client.ErrNotRenewed) {
		t.Errorf("session error %v, want ErrNotRenewed", s.Err())
	}
	if err := recipe.NewMutex(s, "other").Lock(ctx); !errors.Is(err, recipe.ErrSessionLost) {
		t.Errorf("Lock on a lost session: %v, want ErrSessionLost", err)
	}
}
