package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/recipe/embedded"
)

var (
	exampleOnce sync.Once
	exampleN    *node.Node
)

// exampleBackend is a single node embedded in the process, in memory,
// shared by the examples. With a cluster, pass a *client.Client instead.
func exampleBackend() recipe.Backend {
	exampleOnce.Do(func() {
		cfg := node.DefaultConfig()
		cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
		cfg.GossipAddr = "127.0.0.1:0"
		n, err := node.Open(cfg)
		if err != nil {
			log.Fatal(err)
		}
		<-n.Ready()
		if err := n.ReadyErr(); err != nil {
			log.Fatal(err)
		}
		exampleN = n
	})
	return embedded.New(exampleN)
}

func ExampleNewSession() {
	ctx := context.Background()
	s, err := recipe.NewSession(ctx, exampleBackend(), recipe.SessionOptions{Holder: "worker-1", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// One heartbeat keeps every lock, slot and candidacy of the session.
	a, b := recipe.NewMutex(s, "session/a"), recipe.NewMutex(s, "session/b")
	if err := a.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	select {
	case <-s.Done():
		fmt.Println("lost:", s.Err()) // stop touching what the locks guard
	default:
		fmt.Println("alive, deadline ahead:", time.Until(s.Deadline()) > 0)
	}
	// Closing the session releases both locks.
	if err := s.Close(ctx); err != nil {
		log.Fatal(err)
	}
	<-s.Done()
	fmt.Println("closed:", s.Err())
	// Output:
	// alive, deadline ahead: true
	// closed: client: keep-alive stopped
}

func ExampleMutex() {
	ctx := context.Background()
	b := exampleBackend()
	s1, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: "one"})
	if err != nil {
		log.Fatal(err)
	}
	defer s1.Close(ctx)
	s2, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: "two"})
	if err != nil {
		log.Fatal(err)
	}
	defer s2.Close(ctx)

	m1, m2 := recipe.NewMutex(s1, "mutex/printer"), recipe.NewMutex(s2, "mutex/printer")
	if err := m1.Lock(ctx); err != nil { // waits as long as ctx allows
		log.Fatal(err)
	}
	fmt.Println("two's TryLock:", errors.Is(m2.TryLock(ctx), recipe.ErrLocked))

	got := make(chan uint64)
	go func() {
		if err := m2.Lock(ctx); err != nil {
			log.Fatal(err)
		}
		got <- m2.Token()
	}()
	first := m1.Token() // pass it with every access to the printer
	if err := m1.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("two's token is higher:", <-got > first)
	if err := m2.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// two's TryLock: true
	// two's token is higher: true
}

func ExampleSemaphore() {
	ctx := context.Background()
	b := exampleBackend()
	var sems []*recipe.Semaphore
	for _, holder := range []string{"tuner-a", "tuner-b", "tuner-c"} {
		s, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: holder})
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close(ctx)
		sems = append(sems, recipe.NewSemaphore(s, "tuners", 2))
	}
	for i, m := range sems {
		err := m.TryAcquire(ctx)
		fmt.Printf("holder %d: slot %v\n", i, err == nil)
	}
	if err := sems[0].Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder 2 after a release: slot", sems[2].TryAcquire(ctx) == nil)
	// Output:
	// holder 0: slot true
	// holder 1: slot true
	// holder 2: slot false
	// holder 2 after a release: slot true
}

func ExampleElection() {
	ctx := context.Background()
	b := exampleBackend()
	s1, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: "node-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s1.Close(ctx)
	s2, err := recipe.NewSession(ctx, b, recipe.SessionOptions{Holder: "node-2"})
	if err != nil {
		log.Fatal(err)
	}
	defer s2.Close(ctx)

	octx, stop := context.WithCancel(ctx)
	defer stop()
	leaders := recipe.Observe(octx, b, "election/primary")
	fmt.Println("leader at first:", <-leaders)

	e1, e2 := recipe.NewElection(s1, "election/primary"), recipe.NewElection(s2, "election/primary")
	if err := e1.Campaign(ctx, "10.0.0.1:5432"); err != nil {
		log.Fatal(err)
	}
	ld := <-leaders
	fmt.Println("leader:", ld.Holder, ld.Value)

	won := make(chan error)
	go func() { won <- e2.Campaign(ctx, "10.0.0.2:5432") }() // waits
	if err := e1.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-won; err != nil {
		log.Fatal(err)
	}
	for ld = <-leaders; ld == nil; ld = <-leaders {
		// Between the two leaders there may be a moment with none.
	}
	fmt.Println("leader:", ld.Holder, ld.Value)
	cur, err := e1.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("Leader agrees:", cur.LeaseID == ld.LeaseID, cur.FencingToken == e2.Token())
	// Output:
	// leader at first: <nil>
	// leader: node-1 10.0.0.1:5432
	// leader: node-2 10.0.0.2:5432
	// Leader agrees: true true
}
