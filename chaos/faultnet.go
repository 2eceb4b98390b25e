package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// The in-process cluster's network: every connection and packet between
// nodes goes through wrappers that consult one fault table. A connection
// knows its own node (local) and the node at the other end (peer); the
// sender's side decides the fate of every write, so a one-way block is a
// property of who writes, not of who dialled.
//
// Faults on streams (Raft, gossip's TCP, follower forwarding):
//   - blocked (partition, one-way block, killed node): a write in the
//     blocked direction closes the connection instead, existing
//     connections in that direction are closed when the fault is set, and
//     dials in that direction are refused. Bytes are never silently
//     dropped from the middle of a stream (that would desynchronise the
//     framing, which real TCP never does).
//   - loss p: a dial is refused with probability p; a write is held back
//     one retransmission timeout (200 ms, Linux's minimum RTO) with
//     probability p, and cuts the connection with probability p/4.
//   - delay d: every write waits d before it is sent.
//
// Faults on gossip's UDP packets: blocked and lost packets are dropped,
// delayed ones are sent d later (and may be reordered).

// retransmitDelay is how long a "lost" stream write is held back: what TCP
// takes to resend a lost segment.
const retransmitDelay = 200 * time.Millisecond

// peerClient is the peer of a connection from the harness's clients (the
// front proxies); peerUnknown one whose dialler is not ours (yet).
const (
	peerClient  = -1
	peerUnknown = -2
)

// errFault is the error a faulted dial or write returns.
var errFault = errors.New("chaos: cut by an injected network fault")

// faultNet is the fault table and the registry of live connections.
type faultNet struct {
	n int

	mu      sync.Mutex
	blocked map[[2]int]bool // {from, to}: from's traffic to `to` is dropped
	loss    []float64
	lost    int64 // dials refused, writes held back or cut and packets dropped by loss, in total
	delay   []time.Duration
	dead    []bool
	rnd     *rand.Rand
	conns   map[*faultConn]struct{}
	// dialled maps the local address of a connection one of our wrappers
	// dialled to the node (or peerClient) that dialled it, so that the
	// accepting side can tell who is at the other end.
	dialled map[string]int
}

func newFaultNet(n int) *faultNet {
	return &faultNet{n: n, blocked: map[[2]int]bool{}, loss: make([]float64, n),
		delay: make([]time.Duration, n), dead: make([]bool, n),
		rnd:   rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x1ea5e)),
		conns: map[*faultConn]struct{}{}, dialled: map[string]int{}}
}

// cutLocked reports whether traffic from -> to is blocked.
func (f *faultNet) cutLocked(from, to int) bool {
	if from < 0 || to < 0 {
		return false // the harness's clients: see the front proxies
	}
	return f.dead[from] || f.dead[to] || f.blocked[[2]int{from, to}]
}

// dialAllowed decides a dial from -> to.
func (f *faultNet) dialAllowed(from, to int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutLocked(from, to) {
		return false
	}
	if from >= 0 && to >= 0 && f.loss[from] > 0 && f.rnd.Float64() < f.loss[from] {
		f.lost++
		return false
	}
	return true
}

// verdict decides one write (or packet) from -> to: cut it, or send it
// after wait.
func (f *faultNet) verdict(from, to int, stream bool) (cut bool, wait time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from < 0 || to < 0 {
		return false, 0
	}
	if f.cutLocked(from, to) {
		return true, 0
	}
	wait = f.delay[from]
	if p := f.loss[from]; p > 0 {
		r := f.rnd.Float64()
		switch {
		case !stream && r < p:
			f.lost++
			return true, 0
		case stream && r < p/4:
			f.lost++
			return true, 0
		case stream && r < p:
			f.lost++
			wait += retransmitDelay
		}
	}
	return false, wait
}

// enforce closes every live connection whose local side may no longer
// write to its peer. Call it after changing the table.
func (f *faultNet) enforce() {
	f.mu.Lock()
	var doomed []*faultConn
	for c := range f.conns {
		if f.cutLocked(c.local, c.peerLocked(f)) {
			doomed = append(doomed, c)
		}
	}
	f.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// addrOf names a node by one of its addresses; peerUnknown if none.
type addrOf func(addr string) int

// faultConn is one side of a connection between nodes (or between a front
// proxy and a node).
type faultConn struct {
	net.Conn
	f     *faultNet
	local int
	// peer is the node at the other end; peerUnknown until the dialler's
	// registration is seen (it precedes the first byte the dialler sends,
	// hence any answer of ours).
	peer      int
	dialledAs string // key in f.dialled, if we dialled
	closeOnce sync.Once
	closed    chan struct{}
}

func (f *faultNet) wrap(c net.Conn, local, peer int, dialled bool) *faultConn {
	fc := &faultConn{Conn: c, f: f, local: local, peer: peer, closed: make(chan struct{})}
	f.mu.Lock()
	if dialled {
		fc.dialledAs = c.LocalAddr().String()
		f.dialled[fc.dialledAs] = local
	}
	f.conns[fc] = struct{}{}
	f.mu.Unlock()
	return fc
}

func (c *faultConn) peerLocked(f *faultNet) int {
	if c.peer == peerUnknown {
		if p, ok := f.dialled[c.Conn.RemoteAddr().String()]; ok {
			c.peer = p
		}
	}
	return c.peer
}

func (c *faultConn) Write(b []byte) (int, error) {
	c.f.mu.Lock()
	peer := c.peerLocked(c.f)
	c.f.mu.Unlock()
	cut, wait := c.f.verdict(c.local, peer, true)
	if !cut && wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.closed:
			t.Stop()
			return 0, net.ErrClosed
		}
		c.f.mu.Lock() // a block set meanwhile
		cut = c.f.cutLocked(c.local, peer)
		c.f.mu.Unlock()
	}
	if cut {
		c.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Addr: c.RemoteAddr(), Err: errFault}
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		c.f.mu.Lock()
		delete(c.f.conns, c)
		if c.dialledAs != "" && c.f.dialled[c.dialledAs] == c.local {
			delete(c.f.dialled, c.dialledAs)
		}
		c.f.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// dial opens a connection from node local to addr through dial, unless a
// fault refuses it.
func (f *faultNet) dial(local int, addr string, nodeOf addrOf, dial func() (net.Conn, error)) (net.Conn, error) {
	peer := nodeOf(addr)
	if !f.dialAllowed(local, peer) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errFault}
	}
	c, err := dial()
	if err != nil {
		return nil, err
	}
	return f.wrap(c, local, peer, true), nil
}

// faultListener wraps the connections node local accepts.
type faultListener struct {
	net.Listener
	f     *faultNet
	local int
}

func (l *faultListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.f.wrap(c, l.local, peerUnknown, false), nil
}

// raftStream wraps node local's Raft stream layer.
type raftStream struct {
	raft.StreamLayer
	f      *faultNet
	local  int
	nodeOf addrOf
}

func (s *raftStream) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return s.f.wrap(c, s.local, peerUnknown, false), nil
}

func (s *raftStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.f.dial(s.local, string(addr), s.nodeOf, func() (net.Conn, error) {
		return s.StreamLayer.Dial(addr, timeout)
	})
}

// gossipTransport wraps node local's memberlist transport.
type gossipTransport struct {
	memberlist.NodeAwareTransport
	f        *faultNet
	local    int
	nodeOf   addrOf
	streamCh chan net.Conn
	stop     chan struct{}
	stopOnce sync.Once
}

func newGossipTransport(t memberlist.NodeAwareTransport, f *faultNet, local int, nodeOf addrOf) *gossipTransport {
	g := &gossipTransport{NodeAwareTransport: t, f: f, local: local, nodeOf: nodeOf,
		streamCh: make(chan net.Conn), stop: make(chan struct{})}
	go g.acceptStreams()
	return g
}

func (g *gossipTransport) acceptStreams() {
	for {
		select {
		case <-g.stop:
			return
		case c := <-g.NodeAwareTransport.StreamCh():
			fc := g.f.wrap(c, g.local, peerUnknown, false)
			select {
			case g.streamCh <- fc:
			case <-g.stop:
				fc.Close()
				return
			}
		}
	}
}

func (g *gossipTransport) StreamCh() <-chan net.Conn { return g.streamCh }

func (g *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return g.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (g *gossipTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	drop, wait := g.f.verdict(g.local, g.nodeOf(addr.Addr), false)
	switch {
	case drop:
		return time.Now(), nil // lost on the way, as UDP may be
	case wait > 0:
		buf := append([]byte(nil), b...)
		time.AfterFunc(wait, func() {
			select {
			case <-g.stop:
			default:
				g.NodeAwareTransport.WriteToAddress(buf, addr)
			}
		})
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteToAddress(b, addr)
}

func (g *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (g *gossipTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return g.f.dial(g.local, addr.Addr, g.nodeOf, func() (net.Conn, error) {
		return g.NodeAwareTransport.DialAddressTimeout(addr, timeout)
	})
}

func (g *gossipTransport) Shutdown() error {
	g.stopOnce.Do(func() { close(g.stop) })
	return g.NodeAwareTransport.Shutdown()
}

// forwardDialer is node local's dialer for follower forwarding.
func (f *faultNet) forwardDialer(local int, nodeOf addrOf) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 2 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return f.dial(local, addr, nodeOf, func() (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		})
	}
}
