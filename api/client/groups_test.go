package client_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestGroups: against a real server, AcquireGroup takes several keys at
// once (each its own limit and fencing token, one token for the group);
// a busy key refuses the whole group, the error naming that key and its
// holder; GetGroup, RenewGroup and ReleaseGroup act on the whole.
func TestGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, stop := exampleServer()
	defer stop()
	c, err := client.New([]string{addr}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	other, err := c.Acquire(ctx, wire.AcquireRequest{Key: "tuners", Holder: "other", TTLMS: 30_000, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	req := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "tuners", Limit: 1}, {Key: "dedup/s1"}}, Holder: "worker", TTLMS: 30_000}
	_, err = c.AcquireGroup(ctx, req)
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeLeaseHeld || e.Key != "tuners" || len(e.Holders) != 1 || e.Holders[0].LeaseID != other.LeaseID || client.StatusCode(err) != 409 {
		t.Fatalf("busy: %v", err)
	}
	if l, err := c.List(ctx, wire.ListRequest{Key: "dedup/s1"}); err != nil || len(l.Leases) != 0 {
		t.Fatalf("a refused group left %+v %v", l, err)
	}
	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: other.LeaseID, Token: other.Token}); err != nil {
		t.Fatal(err)
	}
	g, err := c.AcquireGroup(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g.Token == "" || len(g.Leases) != 2 || g.Leases[0].Key != "dedup/s1" || g.Leases[1].FencingToken <= other.FencingToken {
		t.Fatalf("group %+v", g)
	}
	// A member is a lease like any other for fencing.
	if v, err := c.Validate(ctx, wire.ValidateRequest{LeaseID: g.Leases[1].LeaseID, Token: g.Token}); err != nil || !v.Valid {
		t.Fatalf("validate a member: %+v %v", v, err)
	}
	rg, err := c.RenewGroup(ctx, g.GroupID, g.Token, 20_000)
	if err != nil || rg.TTLMS != 20_000 || rg.Leases[1].RenewalCount != 1 {
		t.Fatalf("renew: %+v %v", rg, err)
	}
	if got, err := c.GetGroup(ctx, g.GroupID); err != nil || got.GroupID != g.GroupID || got.Leases[0].FencingToken != g.Leases[0].FencingToken {
		t.Fatalf("get: %+v %v", got, err)
	}
	rel, err := c.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token, Reason: "done"})
	if err != nil || rel.State != "released" || rel.Leases[0].EndReason != "done" {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if _, err := c.RenewGroup(ctx, g.GroupID, g.Token, 0); client.ErrorCode(err) != wire.CodeLeaseReleased {
		t.Fatalf("renew after release: %v", err)
	}
}

// TestGroupsCluster: on three servers, a client of a follower takes a
// group (the follower forwards it to the leader), and one that waits for
// its keys is granted when they free; after the leader crashes, the next
// leader has the same group (leases, fences, token) and renews and
// releases it.
func TestGroupsCluster(t *testing.T) {
	ms := testcluster.Start(t, func(n *node.Node) http.Handler { return api.New(api.FromNode(n), api.Options{}) })
	var leader *testcluster.Member
	testcluster.PollUntil(t, 30*time.Second, "a leader", func() bool { leader = testcluster.Leader(ms); return leader != nil })
	var follower *testcluster.Member
	for _, m := range ms {
		if m != leader {
			follower = m
			break
		}
	}
	viaFollower, err := client.New([]string{follower.Addr}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "dedup/s1"}, {Key: "tuners", Limit: 2}}, Holder: "w1", TTLMS: 30_000, IdempotencyKey: "intent-1"}
	var g *wire.LeaseGroup
	testcluster.PollUntil(t, 20*time.Second, "gossip to tell every server reads groups", func() bool {
		g, err = viaFollower.AcquireGroup(ctx, req)
		if err != nil && client.ErrorCode(err) != wire.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})

	// A waiting group through the follower: granted once dedup/s1 frees.
	type res struct {
		g   *wire.LeaseGroup
		err error
	}
	waited := make(chan res, 1)
	go func() {
		wg, err := viaFollower.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "dedup/s1"}, {Key: "x"}}, Holder: "w2", TTLMS: 30_000, WaitMS: 20_000})
		waited <- res{wg, err}
	}()
	// It is queued once x, free, is kept for it: an acquire of x that
	// does not wait is refused (until then the probe gets x and gives it
	// back).
	testcluster.PollUntil(t, 10*time.Second, "the group to queue", func() bool {
		l, err := viaFollower.Acquire(ctx, wire.AcquireRequest{Key: "x", Holder: "probe", TTLMS: 30_000})
		if err == nil {
			if _, err := viaFollower.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
				t.Fatal(err)
			}
			return false
		}
		return client.ErrorCode(err) == wire.CodeLeaseHeld
	})
	if _, err := viaFollower.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil || len(r.g.Leases) != 2 || r.g.Leases[0].FencingToken <= g.Leases[0].FencingToken {
		t.Fatalf("waiting group: %+v %v", r.g, r.err)
	}
	g = r.g

	leader.Stop()
	var rest []string
	for _, m := range ms {
		if m != leader {
			rest = append(rest, m.Addr)
		}
	}
	c, err := client.New(rest, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testcluster.PollUntil(t, 60*time.Second, "the group renewed by the next leader", func() bool {
		_, err := c.RenewGroup(ctx, g.GroupID, g.Token, 0)
		switch client.ErrorCode(err) {
		case "":
			return true
		case wire.CodeNoLeader, wire.CodeUnavailable, wire.CodeIndeterminate:
			return false
		}
		t.Fatalf("renew after failover: %v", err)
		return false
	})
	got, err := c.GetGroup(ctx, g.GroupID)
	if err != nil || got.State != "active" || got.Leases[0].RenewalCount < 1 {
		t.Fatalf("after failover: %+v %v", got, err)
	}
	for i, l := range got.Leases {
		if l.LeaseID != g.Leases[i].LeaseID || l.FencingToken != g.Leases[i].FencingToken {
			t.Fatalf("member %d after failover: %+v, was %+v", i, l, g.Leases[i])
		}
	}
	_, err = c.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "x"}, {Key: "y"}}, Holder: "w3", TTLMS: 30_000})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeLeaseHeld || e.Key != "x" || e.Holders[0].Holder != "w2" {
		t.Fatalf("busy after failover: %v", err)
	}
	if _, err := c.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatal(err)
	}
}
