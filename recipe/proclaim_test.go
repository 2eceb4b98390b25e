package recipe_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/recipe/embedded"
	"github.com/leasehold/leasehold/wire"
)

// TestElectionProclaim: the leader changes its value without losing
// leadership (same lease, same fencing token); Leader and Observe report
// the new value; a campaigner that does not lead cannot proclaim; a value
// past the metadata limits is refused and the value stays. Against a real
// server over HTTP and against an embedded node.
func TestElectionProclaim(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	<-n.Ready()
	srv := httptest.NewServer(api.New(api.FromNode(n), api.Options{}))
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, client.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]recipe.Backend{"http": c, "embedded": embedded.New(n)} {
		t.Run(name, func(t *testing.T) { testProclaim(t, b, "proclaim/"+name) })
	}
}

func testProclaim(t *testing.T, b recipe.Backend, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s1, s2 := newSession(t, b, "node-1", 10*time.Second), newSession(t, b, "node-2", 10*time.Second)
	e1, e2 := recipe.NewElection(s1, key), recipe.NewElection(s2, key)
	if err := e1.Proclaim(ctx, "early"); !errors.Is(err, recipe.ErrNotHeld) {
		t.Fatalf("Proclaim before Campaign: %v", err)
	}
	if err := e1.Campaign(ctx, "10.0.0.1:5432"); err != nil {
		t.Fatal(err)
	}
	first, err := e1.Leader(ctx)
	if err != nil || first.Value != "10.0.0.1:5432" {
		t.Fatalf("leader: %+v, %v", first, err)
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs := recipe.Observe(octx, b, key)
	next := func() *recipe.Leader {
		t.Helper()
		select {
		case ld := <-obs:
			return ld
		case <-ctx.Done():
			t.Fatal("Observe reported nothing")
			return nil
		}
	}
	if ld := next(); ld == nil || ld.Value != "10.0.0.1:5432" {
		t.Fatalf("observed first: %+v", ld)
	}

	if err := e1.Proclaim(ctx, "10.0.0.9:5432"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	if ld := next(); ld == nil || ld.Value != "10.0.0.9:5432" || ld.LeaseID != first.LeaseID || ld.FencingToken != first.FencingToken {
		t.Fatalf("observed after Proclaim: %+v (first %+v)", ld, first)
	}
	cur, err := e1.Leader(ctx)
	if err != nil || cur.Value != "10.0.0.9:5432" || cur.LeaseID != first.LeaseID || cur.Holder != "node-1" {
		t.Fatalf("Leader after Proclaim: %+v, %v", cur, err)
	}
	if !e1.IsLeader() || e1.Token() != first.FencingToken || e1.LostErr() != nil {
		t.Fatalf("Proclaim cost the leadership: leader %v token %d lost %v", e1.IsLeader(), e1.Token(), e1.LostErr())
	}

	// Past the limits: refused, the value stays.
	err = e1.Proclaim(ctx, strings.Repeat("x", 5000))
	if wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("oversized Proclaim: %v", err)
	}
	if cur, err := e1.Leader(ctx); err != nil || cur.Value != "10.0.0.9:5432" || !e1.IsLeader() {
		t.Fatalf("after a refused Proclaim: %+v, %v", cur, err)
	}

	// A campaigner that does not lead cannot proclaim; once it leads it can.
	if err := e2.Proclaim(ctx, "usurper"); !errors.Is(err, recipe.ErrNotHeld) {
		t.Fatalf("Proclaim by a follower: %v", err)
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(ctx, "10.0.0.2:5432") }()
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if err := e1.Proclaim(ctx, "after resign"); !errors.Is(err, recipe.ErrNotHeld) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	if err := e2.Proclaim(ctx, "10.0.0.3:5432"); err != nil {
		t.Fatal(err)
	}
	for {
		ld := next()
		if ld != nil && ld.Holder == "node-2" && ld.Value == "10.0.0.3:5432" {
			break
		}
		if ld != nil && ld.Holder == "node-1" {
			t.Fatalf("observed the old leader after the new one: %+v", ld)
		}
	}
}
