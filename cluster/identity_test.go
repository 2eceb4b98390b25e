package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// idLayer is an identity layer on loopback with a settable cluster id.
func idLayer(t *testing.T, id *atomic.Value, admit func(string) error) raft.StreamLayer {
	t.Helper()
	tcp, err := newTCPStreamLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	l := NewIdentityStreamLayer(tcp, Identity{ClusterID: func() string { return id.Load().(string) }, Admit: admit}, nil)
	t.Cleanup(func() { l.Close() })
	return l
}

func idOf(s string) *atomic.Value {
	var v atomic.Value
	v.Store(s)
	return &v
}

var acceptChans sync.Map // raft.StreamLayer -> chan net.Conn

// accepted returns the next connection l accepts within d, or nil. One
// goroutine per layer accepts (a timed-out wait leaves no Accept behind to
// take a later connection).
func accepted(l raft.StreamLayer, d time.Duration) net.Conn {
	v, loaded := acceptChans.LoadOrStore(l, make(chan net.Conn, 16))
	ch := v.(chan net.Conn)
	if !loaded {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				ch <- c
			}
		}()
	}
	select {
	case c := <-ch:
		return c
	case <-time.After(d):
		return nil
	}
}

// The id exchange: servers of the same cluster, and a server without an id
// yet, connect and then carry bytes untouched; a server of another cluster
// is refused both ways (the dial fails with ErrOtherCluster and the acceptor
// never hands the connection to Raft); Admit can refuse; a peer of an
// earlier version (no exchange) is taken, and dialed without it.
func TestIdentityStreamLayer(t *testing.T) {
	x, y, none := idOf("cluster-x"), idOf("cluster-y"), idOf("")
	ax := idLayer(t, x, nil)
	for _, c := range []struct {
		name string
		dial *atomic.Value
	}{{"same cluster", x}, {"dialer without id", none}} {
		d := idLayer(t, c.dial, nil)
		conn, err := d.Dial(raft.ServerAddress(ax.Addr().String()), 2*time.Second)
		if err != nil {
			t.Fatalf("%s: dial: %v", c.name, err)
		}
		in := accepted(ax, 5*time.Second)
		if in == nil {
			t.Fatalf("%s: not accepted", c.name)
		}
		conn.Write([]byte{0, 1, 2, 'r', 'p', 'c'})
		got := make([]byte, 6)
		in.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(in, got); err != nil || string(got) != "\x00\x01\x02rpc" {
			t.Fatalf("%s: read %q %v", c.name, got, err)
		}
		conn.Close()
		in.Close()
	}
	// An acceptor without an id takes a dialer with one.
	an := idLayer(t, none, nil)
	dx := idLayer(t, x, nil)
	if conn, err := dx.Dial(raft.ServerAddress(an.Addr().String()), 2*time.Second); err != nil {
		t.Fatalf("to a server without id: %v", err)
	} else {
		conn.Close()
	}

	// Another cluster, both ways.
	dy := idLayer(t, y, nil)
	if _, err := dy.Dial(raft.ServerAddress(ax.Addr().String()), 2*time.Second); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("y dials x: %v", err)
	}
	if _, err := ax.Dial(raft.ServerAddress(dy.Addr().String()), 2*time.Second); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("x dials y: %v", err)
	}
	if c := accepted(ax, 300*time.Millisecond); c != nil {
		t.Fatal("x accepted a connection from y")
	}
	if c := accepted(dy, 300*time.Millisecond); c != nil {
		t.Fatal("y accepted a connection from x")
	}
	// The id is read at every connection: y's server learns it is in x.
	y.Store("cluster-x")
	if conn, err := dy.Dial(raft.ServerAddress(ax.Addr().String()), 2*time.Second); err != nil {
		t.Fatalf("after the id changed: %v", err)
	} else {
		conn.Close()
	}
	if c := accepted(ax, 5*time.Second); c == nil {
		t.Fatal("not accepted after the id changed")
	} else {
		c.Close()
	}

	// Admit refuses.
	var admit atomic.Bool
	ad := idLayer(t, none, func(peer string) error {
		if !admit.Load() {
			return fmt.Errorf("not admitted (peer %s)", peer)
		}
		return nil
	})
	if _, err := dx.Dial(raft.ServerAddress(ad.Addr().String()), 2*time.Second); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("dial to a server that does not admit: %v", err)
	}
	admit.Store(true)
	if conn, err := dx.Dial(raft.ServerAddress(ad.Addr().String()), 2*time.Second); err != nil {
		t.Fatalf("dial once admitted: %v", err)
	} else {
		conn.Close()
	}
	if c := accepted(ad, 5*time.Second); c == nil {
		t.Fatal("not accepted once admitted")
	} else {
		c.Close()
	}

	// A peer of an earlier version (a Raft RPC without the exchange) is
	// taken, its bytes intact, unless Admit refuses.
	rpc := []byte{0, 0x81, 0xa4, 'T', 'e', 'r', 'm', 0xcf, 1, 2, 3, 4, 5, 6, 7, 8}
	raw, err := net.DialTimeout("tcp", ax.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write(rpc)
	in := accepted(ax, 5*time.Second)
	if in == nil {
		t.Fatal("a peer of an earlier version was not accepted")
	}
	got := make([]byte, len(rpc))
	in.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(in, got); err != nil || string(got) != string(rpc) {
		t.Fatalf("legacy bytes %x %v", got, err)
	}
	in.Close()
	admit.Store(false)
	raw2, err := net.DialTimeout("tcp", ad.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw2.Close()
	raw2.Write(rpc)
	raw2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := raw2.Read(make([]byte, 8)); err == nil {
		t.Fatal("a legacy peer got an answer from a server that does not admit")
	}
	if c := accepted(ad, 300*time.Millisecond); c != nil {
		t.Fatal("a legacy peer was accepted by a server that does not admit")
	}

	// Toward a peer of an earlier version, Dial sends nothing of its own.
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	tcp, err := newTCPStreamLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	dl := NewIdentityStreamLayer(tcp, Identity{ClusterID: func() string { return "cluster-x" },
		Legacy: func(a string) bool { return a == old.Addr().String() }}, nil)
	defer dl.Close()
	conn, err := dl.Dial(raft.ServerAddress(old.Addr().String()), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer, err := old.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	conn.Write([]byte{2})
	one := make([]byte, 1)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, one); err != nil || one[0] != 2 {
		t.Fatalf("the legacy peer read %x %v first", one, err)
	}
}

// Raft over identity layers: a server of another cluster added as a member
// receives nothing, and none of the (pre-)vote requests of one that
// believes it belongs to the cluster and campaigns reaches a server that
// knows the cluster's id; a server without an id joins.
func TestRaftRefusesOtherCluster(t *testing.T) {
	open := func(id string, bootstrap bool, cid string) (*Cluster, *countFSM) {
		f := &countFSM{}
		v := idOf(cid)
		c, err := Open(Config{NodeID: id, Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: bootstrap,
			Identity:         &Identity{ClusterID: func() string { return v.Load().(string) }},
			HeartbeatTimeout: 1500 * time.Millisecond, ElectionTimeout: 1500 * time.Millisecond,
			LeaderLeaseTimeout: 750 * time.Millisecond}, f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, f
	}
	a, fa := open("a", true, "x")
	waitLeader(t, a)
	b, fb := open("b", false, "") // new: no id yet
	if err := a.raft.AddVoter("b", raft.ServerAddress(b.Addr), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := a.raft.Apply([]byte("one"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "b replicates", func() bool { return fb.n.Load() == 1 })

	// d bootstrapped cluster y: added to x, it receives nothing.
	d, fd := open("d", true, "y")
	waitLeader(t, d)
	if err := a.raft.AddNonvoter("d", raft.ServerAddress(d.Addr), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := a.raft.Apply([]byte("two"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "b replicates", func() bool { return fb.n.Load() == 2 })
	time.Sleep(500 * time.Millisecond) // nothing must reach d: a chance to replicate to it, were it possible
	if n := fd.n.Load(); n != 0 {
		t.Fatalf("the server of another cluster applied %d entries of x", n)
	}
	if err := a.raft.RemoveServer("d", 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}

	// e (cluster y) believes it is a voter with a and b and campaigns: none
	// of its (pre-)vote requests reaches a. (b has no id in this test, as a
	// new server before it receives the cluster's state: it talks to any
	// cluster. Terms are not compared: on a loaded machine a and b may hold
	// an ordinary election between them; what a receives says what e did.)
	votes := make(chan raft.Observation, 64)
	fromE := func(o *raft.Observation) bool {
		switch r := o.Data.(type) {
		case raft.RequestVoteRequest:
			return string(r.ID) == "e"
		case raft.RequestPreVoteRequest:
			return string(r.ID) == "e"
		}
		return false
	}
	obs := raft.NewObserver(votes, false, fromE)
	a.raft.RegisterObserver(obs)
	t.Cleanup(func() { a.raft.DeregisterObserver(obs) })
	e, _ := open("e", false, "y")
	if err := e.BootstrapWith([]Server{{ID: "e", Address: e.Addr, Voter: true}, {ID: "a", Address: a.Addr, Voter: true}, {ID: "b", Address: b.Addr, Voter: true}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "e campaigns", func() bool { return e.raft.State() == raft.Candidate })
	time.Sleep(2 * time.Second) // nothing must reach a: more campaigns of e's, were they heard
	select {
	case o := <-votes:
		t.Fatalf("a request of e's campaign reached a server of cluster x: %+v", o.Data)
	default:
	}
	if fa.n.Load() != 2 || fb.n.Load() != 2 {
		t.Fatalf("cluster x applied %d and %d entries, want 2 each", fa.n.Load(), fb.n.Load())
	}
}
