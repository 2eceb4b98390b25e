package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// wantOutOfService fails unless err is the gate's refusal with state.
func wantOutOfService(t *testing.T, what string, err error, state ServiceState) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeOutOfService || we.ServiceState != string(state) {
		t.Errorf("%s: %v, want OUT_OF_SERVICE (%s)", what, err, state)
	}
}

// TestGateDivergedFollowerAnswersNothing: a follower told that its state
// differs answers no read from it, stale or not (leases, sessions,
// groups, grants, validate, cluster and control status), opens no event
// stream and ends the ones it serves, all with 503 OUT_OF_SERVICE naming
// the state; its local state still answers (an operator's view), and the
// others serve on. A follower whose log is damaged does the same.
func TestGateDivergedFollowerAnswersNothing(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := l.CreateSession(ctx, wire.SessionRequest{Holder: "h", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	var followers []*Node
	for _, id := range []string{"n1", "n2", "n3"} {
		if n := c.node(id); n != l {
			followers = append(followers, n)
		}
	}
	f, g := followers[0], followers[1]
	target := l.AppliedIndex()
	waitFor(t, 20*time.Second, func() bool { return f.AppliedIndex() >= target && g.AppliedIndex() >= target })
	if _, err := f.GetLease(ctx, lease.LeaseID, true); err != nil {
		t.Fatalf("stale read before: %v", err)
	}
	sub, err := f.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	f.sc.markDiverged(divergedNotice{Index: target, Sum: "aaaa", Majority: "bbbb", By: "the test"})

	if st, why := f.Service(); st != ServiceDiverged || !strings.Contains(why, "differs from the cluster's") {
		t.Fatalf("service state %s (%s)", st, why)
	}
	paths := map[string]func(*Node) error{
		"stale lease read": func(n *Node) error { _, err := n.GetLease(ctx, lease.LeaseID, true); return err },
		"lease read":       func(n *Node) error { _, err := n.GetLease(ctx, lease.LeaseID, false); return err },
		"stale lease list": func(n *Node) error { _, err := n.ListLeases(ctx, wire.ListRequest{}, true); return err },
		"stale session":    func(n *Node) error { _, err := n.GetSession(ctx, sess.SessionID, true); return err },
		"stale sessions":   func(n *Node) error { _, err := n.ListSessions(ctx, "", "", 10, true); return err },
		"stale group":      func(n *Node) error { _, err := n.GetGroup(ctx, "lg_1", true); return err },
		"stale grant keys": func(n *Node) error { _, err := n.GrantKeys(ctx, true); return err },
		"stale grant": func(n *Node) error {
			_, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: lease.LeaseID, Token: lease.Token}, true)
			return err
		},
		"validate": func(n *Node) error {
			_, err := n.Validate(ctx, wire.ValidateRequest{LeaseID: lease.LeaseID, Token: lease.Token})
			return err
		},
		"stale cluster status": func(n *Node) error { _, err := n.ClusterStatus(ctx, true); return err },
		"stale control status": func(n *Node) error { _, err := n.ControlStatus(ctx, true); return err },
		"subscribe": func(n *Node) error {
			s, err := n.Subscribe(ctx, wire.EventFilter{})
			if s != nil {
				s.Close()
			}
			return err
		},
		"renew": func(n *Node) error { _, err := n.Renew(ctx, lease.LeaseID, lease.Token, 0); return err },
	}
	for what, p := range paths {
		wantOutOfService(t, "diverged follower: "+what, p(f), ServiceDiverged)
	}
	select {
	case _, open := <-sub.Events():
		for open {
			_, open = <-sub.Events()
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the open event stream did not end")
	}
	wantOutOfService(t, "the open event stream", sub.Err(), ServiceDiverged)
	if st, err := f.LocalState(ctx, 0); err != nil || st.NodeID != f.cfg.NodeID {
		t.Fatalf("local state of the diverged server: %+v %v", st, err)
	}

	// The other servers serve on.
	if _, err := l.GetLease(ctx, lease.LeaseID, false); err != nil {
		t.Fatalf("the leader: %v", err)
	}
	if _, err := g.GetLease(ctx, lease.LeaseID, true); err != nil {
		t.Fatalf("the other follower: %v", err)
	}

	// A damaged log: the same.
	msg := "leasehold: committed log entry 7 does not decode (the test)"
	g.rep.broken.Store(&msg)
	for what, p := range paths {
		wantOutOfService(t, "damaged follower: "+what, p(g), ServiceDamaged)
	}
}

// TestGateDivergedLeaderRefusesWrites: a leader told that its state
// differs commits nothing from then on, a write or a tick, while it still
// leads, and keeps handing leadership on (here it cannot: it is the only
// voter) rather than trying once.
func TestGateDivergedLeaderRefusesWrites(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	lease, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	n.sc.markDiverged(divergedNotice{Index: n.AppliedIndex(), Sum: "aaaa", Majority: "bbbb", By: "the test"})
	_, _, err = n.Acquire(ctx, wire.AcquireRequest{Key: "k2", Holder: "h", TTLMS: 600000})
	wantOutOfService(t, "acquire on the diverged leader", err, ServiceDiverged)
	_, err = n.Release(ctx, wire.ReleaseRequest{LeaseID: lease.LeaseID, Token: lease.Token})
	wantOutOfService(t, "release on the diverged leader", err, ServiceDiverged)
	_, err = n.GetLease(ctx, lease.LeaseID, false)
	wantOutOfService(t, "linearizable read on the diverged leader", err, ServiceDiverged)

	// Its clock stops: no tick commits (one proposed before may still).
	tick := n.rep.tick.Load()
	waitFor(t, 30*time.Second, func() bool { return n.sc.stepDowns.Load() >= 3 })
	if !n.cl.IsLeader() {
		t.Fatal("the only voter stopped leading") // the test's premise
	}
	if now := n.rep.tick.Load(); now > tick+1 {
		t.Fatalf("the diverged leader committed ticks %d to %d", tick+1, now)
	}
}
