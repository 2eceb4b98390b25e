package recipe_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/recipe/embedded"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestRecipeGrants: a Mutex, Semaphore or Election holder gets a grant of
// its lease that verifies against the cluster's keys; a resource's
// FenceGuard takes the next holder's grant and then refuses the earlier
// one; without the lock Grant is ErrNotHeld, and a Backend without grants
// says so. Against a real server over HTTP and an embedded node.
func TestRecipeGrants(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deadline := time.Now().Add(10 * time.Second)
	for ks, err := c.Keys(ctx); err != nil || len(ks.Keys) == 0; ks, err = c.Keys(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("no key recorded: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	v := c.GrantVerifier(grant.VerifierOptions{})
	for name, b := range map[string]recipe.Backend{"http": c, "embedded": embedded.New(n)} {
		t.Run(name, func(t *testing.T) {
			key := "grants/" + name
			s1, s2 := newSession(t, b, name+"-1", 10*time.Second), newSession(t, b, name+"-2", 10*time.Second)
			m1, m2 := recipe.NewMutex(s1, key), recipe.NewMutex(s2, key)
			if _, err := m1.Grant(ctx); !errors.Is(err, recipe.ErrNotHeld) {
				t.Fatalf("Grant before Lock: %v", err)
			}
			if err := m1.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			g1, err := m1.Grant(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c1, err := v.Verify(ctx, g1)
			if err != nil || c1.FencingToken != m1.Token() || c1.Key != key || c1.Holder != name+"-1" || c1.SessionID != s1.ID() {
				t.Fatalf("grant %+v %v (token %d)", c1, err, m1.Token())
			}
			guard := client.NewFenceGuard(0)
			if _, err := guard.CheckGrant(ctx, v, g1); err != nil {
				t.Fatal(err)
			}
			if err := m1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := m1.Grant(ctx); !errors.Is(err, recipe.ErrNotHeld) {
				t.Fatalf("Grant after Unlock: %v", err)
			}
			if err := m2.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			g2, err := m2.Grant(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := guard.CheckGrant(ctx, v, g2); err != nil {
				t.Fatal(err)
			}
			if _, err := guard.CheckGrant(ctx, v, g1); !errors.Is(err, client.ErrStaleToken) {
				t.Fatalf("the earlier holder's grant: %v", err)
			}

			sem := recipe.NewSemaphore(s1, key+"/slots", 3)
			if err := sem.Acquire(ctx); err != nil {
				t.Fatal(err)
			}
			if g, err := sem.Grant(ctx); err != nil {
				t.Fatal(err)
			} else if cl, err := v.Verify(ctx, g); err != nil || cl.Limit != 3 {
				t.Fatalf("semaphore grant %+v %v", cl, err)
			}
			e := recipe.NewElection(s2, key+"/leader")
			if err := e.Campaign(ctx, "me"); err != nil {
				t.Fatal(err)
			}
			if g, err := e.Grant(ctx); err != nil {
				t.Fatal(err)
			} else if cl, err := v.Verify(ctx, g); err != nil || cl.FencingToken != e.Token() {
				t.Fatalf("election grant %+v %v", cl, err)
			}

			// A Backend without grants.
			plain := newSession(t, struct{ recipe.Backend }{b}, name+"-3", 10*time.Second)
			m3 := recipe.NewMutex(plain, key+"/plain")
			if err := m3.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := m3.Grant(ctx); !errors.Is(err, recipe.ErrNoGrants) {
				t.Fatalf("a backend without grants: %v", err)
			}
		})
	}
}
