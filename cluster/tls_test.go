package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/internal/testpki"
)

// tlsFor is a TLSConfig with a certificate issued by ca and peers verified
// against trust.
func tlsFor(t *testing.T, ca *testpki.CA, name string, trust *testpki.CA) *TLSConfig {
	cert := ca.Issue(name).TLS(t)
	return &TLSConfig{Certificate: func() (*tls.Certificate, error) { return &cert, nil }, CAs: trust.Pool()}
}

func openTLS(t *testing.T, id string, bootstrap bool, tc *TLSConfig) (*Cluster, *countFSM) {
	t.Helper()
	f := &countFSM{}
	// Slower than the LAN defaults: under -race on a loaded machine a
	// leader must not step down on its own while the test watches that a
	// stranger does not make it.
	c, err := Open(Config{NodeID: id, Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: bootstrap, TLS: tc,
		HeartbeatTimeout: 1500 * time.Millisecond, ElectionTimeout: 1500 * time.Millisecond,
		LeaderLeaseTimeout: 750 * time.Millisecond}, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, f
}

func rejected(c *Cluster) int64 { return c.stream.(*tlsStreamLayer).rejected.Load() }

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		<-tick.C
	}
}

// leaderAmong is whichever of cs is the leader, waiting up to 30 s for one
// (a loaded machine may depose a leader: the test is about who may talk
// to whom, not about a leader's tenure).
func leaderAmong(t *testing.T, cs ...*Cluster) *Cluster {
	t.Helper()
	var l *Cluster
	waitFor(t, 30*time.Second, "a leader", func() bool {
		for _, c := range cs {
			if c.raft.State() == raft.Leader {
				l = c
				return true
			}
		}
		return false
	})
	return l
}

// viaLeader runs op on the leader among cs, again on the next one if the
// leadership moved meanwhile.
func viaLeader(t *testing.T, what string, op func(l *Cluster) error, cs ...*Cluster) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := op(leaderAmong(t, cs...))
		if err == nil {
			return
		}
		if !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost) || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v: again, through the new leader", what, err)
	}
}

// Three servers with certificates from the cluster CA form a cluster over
// mutual TLS and replicate. A server with a certificate from another CA is
// refused: added as a member it receives nothing, and campaigning with a
// configuration naming the others none of its (pre-)vote requests reaches
// them, so it cannot move their term or leader.
func TestRaftMutualTLS(t *testing.T) {
	good, evil := testpki.NewCA(t, "cluster-ca"), testpki.NewCA(t, "other-ca")
	a, fa := openTLS(t, "a", true, tlsFor(t, good, "a", good))
	waitLeader(t, a)
	b, fb := openTLS(t, "b", false, tlsFor(t, good, "b", good))
	c, fc := openTLS(t, "c", false, tlsFor(t, good, "c", good))
	members := []*Cluster{a, b, c}
	// (A voter added before it answers makes the leader's quorum wait on
	// it: a loaded machine lost a's leadership while adding c.)
	for _, s := range []*Cluster{b, c} {
		viaLeader(t, "add "+s.cfg.NodeID, func(l *Cluster) error {
			return l.raft.AddVoter(raft.ServerID(s.cfg.NodeID), raft.ServerAddress(s.Addr), 0, 10*time.Second).Error()
		}, members...)
	}
	for i := range 10 {
		viaLeader(t, "apply", func(l *Cluster) error { return l.raft.Apply(fmt.Appendf(nil, "cmd%d", i), 5*time.Second).Error() }, members...)
	}
	// (An apply retried after a lost leadership may have been applied
	// twice: at least, and the same on every server.)
	waitFor(t, 15*time.Second, "replicated over TLS", func() bool {
		n := fa.n.Load()
		return n >= 10 && fb.n.Load() == n && fc.n.Load() == n
	})
	if r := rejected(a) + rejected(b) + rejected(c); r != 0 {
		t.Fatalf("%d connections refused between servers of the same CA", r)
	}

	// d has a certificate from another CA (and trusts that CA): the leader
	// cannot replicate to it.
	d, fd := openTLS(t, "d", false, tlsFor(t, evil, "d", evil))
	viaLeader(t, "add d", func(l *Cluster) error {
		return l.raft.AddNonvoter("d", raft.ServerAddress(d.Addr), 0, 10*time.Second).Error()
	}, members...)
	waitFor(t, 15*time.Second, "d refuses the leader", func() bool { return rejected(d) > 0 })
	viaLeader(t, "apply", func(l *Cluster) error { return l.raft.Apply([]byte("after-d"), 5*time.Second).Error() }, members...)
	waitFor(t, 15*time.Second, "the others still replicate", func() bool {
		n := fa.n.Load()
		return n >= 11 && fb.n.Load() == n && fc.n.Load() == n
	})
	if n := fd.n.Load(); n != 0 {
		t.Fatalf("the wrong-CA server applied %d entries", n)
	}
	viaLeader(t, "remove d", func(l *Cluster) error { return l.raft.RemoveServer("d", 0, 10*time.Second).Error() }, members...)

	// e (wrong CA) believes it is a voter in a cluster with a, b and c and
	// campaigns: its requests never pass the handshake. Every (pre-)vote
	// request that reaches a, b or c is observed: none may come from e.
	// (Comparing terms instead failed when a loaded machine deposed a for
	// reasons of its own.)
	e, _ := openTLS(t, "e", false, tlsFor(t, evil, "e", evil))
	var fromE atomic.Int64
	for _, s := range members {
		ch := make(chan raft.Observation, 16)
		obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
			var h raft.RPCHeader
			switch r := o.Data.(type) {
			case raft.RequestVoteRequest:
				h = r.RPCHeader
			case raft.RequestPreVoteRequest:
				h = r.RPCHeader
			default:
				return false
			}
			if string(h.ID) == "e" || string(h.Addr) == e.Addr {
				fromE.Add(1)
			}
			return false
		})
		s.raft.RegisterObserver(obs)
		defer s.raft.DeregisterObserver(obs)
	}
	servers := []Server{{ID: "e", Address: e.Addr, Voter: true}}
	for _, s := range members {
		servers = append(servers, Server{ID: s.cfg.NodeID, Address: s.Addr, Voter: true})
	}
	if err := e.BootstrapWith(servers); err != nil {
		t.Fatal(err)
	}
	// Count the refused connections: e tried each of a, b and c.
	before := [3]int64{rejected(a), rejected(b), rejected(c)}
	waitFor(t, 20*time.Second, "e campaigns and is refused by a, b and c", func() bool {
		return rejected(a) > before[0] && rejected(b) > before[1] && rejected(c) > before[2]
	})
	if n := fromE.Load(); n != 0 {
		t.Fatalf("%d vote requests of e's reached a, b or c", n)
	}
	for _, s := range members {
		if _, id := s.raft.LeaderWithID(); id == "e" {
			t.Fatalf("%s follows e", s.cfg.NodeID)
		}
	}
	if e.raft.State() == raft.Leader {
		t.Fatal("e leads")
	}
	viaLeader(t, "apply", func(l *Cluster) error { return l.raft.Apply([]byte("after-e"), 5*time.Second).Error() }, members...)
}

// A plaintext Raft connection to a TLS server is refused before Raft sees
// it, and a TLS dial to a server of another CA fails the handshake.
func TestRaftTLSRefusesPlaintextAndStrangers(t *testing.T) {
	good, evil := testpki.NewCA(t, "cluster-ca"), testpki.NewCA(t, "other-ca")
	a, _ := openTLS(t, "a", true, tlsFor(t, good, "a", good))
	conn, err := net.DialTimeout("tcp", string(a.Addr), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A raft RPC header in plaintext: the TLS server reads it as a bad
	// ClientHello and drops the connection.
	conn.Write([]byte{0, 0x81, 0xa4, 'T', 'e', 'r', 'm', 0xcf})
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 64)); err == nil {
		// an alert record may come first; the connection must then close
		if _, err := conn.Read(make([]byte, 64)); err == nil {
			t.Fatal("plaintext connection got an answer")
		}
	}
	conn.Close()
	waitFor(t, 10*time.Second, "plaintext refused", func() bool { return rejected(a) >= 1 })

	// A stranger's stream layer dialling a: refused on both sides.
	tcp, err := newTCPStreamLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := NewTLSStreamLayer(tcp, tlsFor(t, evil, "x", evil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if _, err := stranger.Dial(raft.ServerAddress(a.Addr), 5*time.Second); err == nil {
		t.Fatal("a server of another CA completed a handshake")
	}
	// Same CA but trusting only the other CA: still refused (a's
	// certificate does not verify).
	tcp2, err := newTCPStreamLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	confused, err := NewTLSStreamLayer(tcp2, tlsFor(t, good, "y", evil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer confused.Close()
	if _, err := confused.Dial(raft.ServerAddress(a.Addr), 5*time.Second); err == nil {
		t.Fatal("a server that does not trust the cluster CA completed a handshake")
	}
	// And a proper peer gets through.
	tcp3, err := newTCPStreamLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := NewTLSStreamLayer(tcp3, tlsFor(t, good, "z", good), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	pc, err := peer.Dial(raft.ServerAddress(a.Addr), 5*time.Second)
	if err != nil {
		t.Fatalf("a peer of the cluster CA: %v", err)
	}
	pc.Close()
}

func TestRaftTLSConfigValidated(t *testing.T) {
	_, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true,
		TLS: &TLSConfig{}}, &countFSM{})
	if err == nil {
		t.Fatal("a TLS config without certificate and CAs must be refused")
	}
}
