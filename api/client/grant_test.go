package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestClientGrants: against three real servers, the client asks for
// grants on acquire and renewal and reads one as the holder (stale reads:
// signed by the contacted follower); its verifier checks them all against
// the key set it fetched once; FenceGuard.CheckGrant accepts each new
// holder's grant, refuses an earlier holder's and a forged one (recording
// nothing for it).
func TestClientGrants(t *testing.T) {
	ms := testcluster.Start(t, func(n *node.Node) http.Handler { return api.New(api.FromNode(n), api.Options{}) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(testcluster.Addrs(ms), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testcluster.PollUntil(t, 30*time.Second, "every server's grant key in the key set", func() bool {
		ks, err := c.Keys(ctx)
		return err == nil && len(ks.Keys) == 3
	})
	fetches := 0
	v := grant.NewVerifier(func(ctx context.Context) (*grant.KeySet, error) { fetches++; return c.Keys(ctx) }, grant.VerifierOptions{})

	l1, err := c.Acquire(ctx, wire.AcquireRequest{Key: "printer", Holder: "w1", TTLMS: 30000, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(ctx, l1.Grant)
	if err != nil || claims.FencingToken != l1.FencingToken || claims.Key != "printer" {
		t.Fatalf("acquire's grant: %+v %v", claims, err)
	}
	r, err := c.RenewWith(ctx, wire.RenewRequest{LeaseID: l1.LeaseID, Token: l1.Token, Grant: true})
	if err != nil || r.Grant == "" {
		t.Fatalf("renew: %+v %v", r, err)
	}
	if _, err := v.Verify(ctx, r.Grant); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Renew(ctx, l1.LeaseID, l1.Token, 0); err != nil || r.Grant != "" {
		t.Fatalf("renew without grant: %+v %v", r, err)
	}
	// Every server's grant verifies with the one set fetched.
	servers := map[string]bool{}
	for _, m := range ms {
		sc, err := client.New([]string{m.Addr}, client.Options{StaleReads: true})
		if err != nil {
			t.Fatal(err)
		}
		var g *wire.Lease
		testcluster.PollUntil(t, 10*time.Second, "the lease on "+m.ID, func() bool {
			g, err = sc.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l1.LeaseID, Token: l1.Token})
			return err == nil
		})
		cl, err := v.Verify(ctx, g.Grant)
		if err != nil {
			t.Fatalf("%s's grant: %v", m.ID, err)
		}
		servers[cl.ServerID] = true
	}
	if len(servers) != 3 || fetches != 1 {
		t.Fatalf("grants signed by %v, %d key set fetches", servers, fetches)
	}
	if _, err := c.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l1.LeaseID, Token: "wrong"}); !errors.Is(err, &wire.Error{Code: wire.CodeLeaseTokenInvalid}) {
		t.Fatalf("wrong token: %v", err)
	}

	// The resource side.
	guard := client.NewFenceGuard(100)
	if _, err := guard.CheckGrant(ctx, v, l1.Grant); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: l1.LeaseID, Token: l1.Token}); err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire(ctx, wire.AcquireRequest{Key: "printer", Holder: "w2", TTLMS: 30000, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := guard.CheckGrant(ctx, v, l2.Grant); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.CheckGrant(ctx, v, l1.Grant); !errors.Is(err, client.ErrStaleToken) {
		t.Fatalf("the earlier holder's grant: %v", err)
	}
	p := strings.Split(l2.Grant, ".")
	forged := strings.Split(l1.Grant, ".")[0] + "." + p[1] + "." + strings.Split(l1.Grant, ".")[2]
	if _, err := guard.CheckGrant(ctx, v, forged); !errors.Is(err, grant.ErrBadSignature) {
		t.Fatalf("a forged grant: %v", err)
	}
	if h, _ := guard.Highest("printer"); h != l2.FencingToken {
		t.Fatalf("highest %d, want %d", h, l2.FencingToken)
	}
}

// staticVerifier verifies grants against one key set, with expiry off.
func staticVerifier(ks *grant.KeySet) client.GrantVerifier {
	return grant.NewVerifier(grant.StaticKeys(ks), grant.VerifierOptions{VerifyOptions: grant.VerifyOptions{IgnoreExpiry: true}})
}

// TestCheckGrantSemaphore: a semaphore slot's grant is fenced per holder
// and against the key's exclusive grants; an exclusive grant against every
// token seen for the key.
func TestCheckGrantSemaphore(t *testing.T) {
	ctx := context.Background()
	key := grant.GenerateKey()
	s := grant.NewSigner(key)
	ks := &grant.KeySet{ClusterID: "c", Keys: []grant.JWK{grant.PublicJWK(s.Public())}}
	v := staticVerifier(ks)
	g := func(holder string, limit uint32, fence uint64) string {
		t.Helper()
		tok, err := s.Sign(&grant.Claims{ClusterID: "c", IssuedAt: 1, Expiry: 2, Key: "tuners", LeaseID: "ls_x", Holder: holder, FencingToken: fence, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	guard := &client.FenceGuard{}
	for _, c := range []struct {
		grant string
		ok    bool
	}{
		{g("a", 3, 10), true},
		{g("b", 3, 12), true},
		{g("a", 3, 9), false}, // a's earlier slot
		{g("c", 3, 5), true},  // another holder's slot: not orderable
		{g("a", 3, 15), true},
		{g("a", 3, 10), false},
		{g("x", 1, 14), false}, // exclusive below a slot seen
		{g("x", 1, 20), true},
		{g("b", 3, 12), false}, // a slot from before the exclusive grant
		{g("b", 3, 21), true},
	} {
		_, err := guard.CheckGrant(ctx, v, c.grant)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, client.ErrStaleToken) {
			tok, _ := grant.Parse(c.grant)
			t.Fatalf("%s limit %d token %d: %v, want ok %v", tok.Claims.Holder, tok.Claims.Limit, tok.Claims.FencingToken, err, c.ok)
		}
	}
	// A bare token of Check meets the same per-key record.
	if err := guard.Check("tuners", 20); !errors.Is(err, client.ErrStaleToken) {
		t.Fatalf("Check below the highest: %v", err)
	}
}
