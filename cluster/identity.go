package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Identity makes every Raft connection start with an exchange of cluster
// ids, so that servers of two clusters never exchange Raft traffic: the
// dialer sends its cluster id, the acceptor answers with its own and
// whether it takes the connection. When both ids are set and differ, both
// sides close it. A server without an id yet (a new server that has not
// received the cluster's state) talks to any cluster.
//
// Servers of a version before this exchange (a rolling upgrade) neither
// send nor expect it: a connection whose first byte is not the exchange's
// is taken as such a peer's, of unknown cluster (Admit still applies), and
// Dial skips the exchange toward a peer Legacy names.
type Identity struct {
	// ClusterID returns this server's cluster id; "" while it has none.
	// Called for every connection; must be safe for concurrent use.
	ClusterID func() string
	// Admit, if set, may refuse an inbound connection that the ids allow
	// (a server with no Raft state that the cluster does not know yet);
	// its error is what the dialer is told. Nil admits.
	Admit func(peerCluster string) error
	// OnConflict, if set, is called (at most once a second) when a peer of
	// another cluster is refused, in either direction.
	OnConflict func(peerAddr, peerCluster string)
	// Legacy, if set, tells whether the peer at a Raft address runs a
	// version without the exchange (from gossip); Dial then connects
	// without it.
	Legacy func(addr string) bool
}

// identityMagic starts the dialer's hello. Raft's own first byte is an RPC
// type (0-3), so a peer that does not speak this exchange is told apart.
var identityMagic = [4]byte{'L', 'H', 'C', '1'}

// peerMagic starts the hello of a node-to-node stream (see
// Cluster.PeerListener): the same exchange of cluster ids, after which the
// connection carries HTTP between servers instead of Raft.
var peerMagic = [4]byte{'L', 'H', 'P', '1'}

const (
	identityOK      byte = 0
	identityRefused byte = 1

	identityTimeout = 5 * time.Second
	maxPendingHello = 64
)

// ErrOtherCluster is returned by Dial when the peer belongs to another
// cluster (or refused this server).
var ErrOtherCluster = errors.New("cluster: raft peer refused the connection")

// NewIdentityStreamLayer wraps inner so that every connection starts with
// the cluster id exchange (see Identity).
func NewIdentityStreamLayer(inner raft.StreamLayer, id Identity, log *slog.Logger) raft.StreamLayer {
	return newIdentityLayer(inner, id, log)
}

func newIdentityLayer(inner raft.StreamLayer, id Identity, log *slog.Logger) *identityLayer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &identityLayer{acceptQueue: newAcceptQueue(inner), id: id, log: log, peers: make(chan net.Conn)}
	go s.run(maxPendingHello, s.hello, func(net.Conn) {})
	return s
}

type identityLayer struct {
	*acceptQueue
	id  Identity
	log *slog.Logger
	// peers receives the node-to-node streams that passed the exchange.
	peers chan net.Conn

	logMu   sync.Mutex
	lastLog time.Time
	quiet   int
}

func (s *identityLayer) local() string {
	if s.id.ClusterID == nil {
		return ""
	}
	return s.id.ClusterID()
}

func writeHello(w io.Writer, prefix []byte, id string) error {
	if len(id) > 255 {
		return errors.New("cluster id too long")
	}
	b := append(append([]byte(nil), prefix...), byte(len(id)))
	b = append(b, id...)
	_, err := w.Write(b)
	return err
}

func readID(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// Dial connects and exchanges ids within timeout (at most 5 s).
func (s *identityLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dial(addr, timeout, identityMagic)
}

// ErrPeerLegacy is returned by DialPeer toward a server whose version has
// no node-to-node streams.
var ErrPeerLegacy = errors.New("cluster: the server runs a version without node-to-node streams")

// dialPeer opens a node-to-node stream to the server at Raft address addr.
func (s *identityLayer) dialPeer(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.id.Legacy != nil && s.id.Legacy(string(addr)) {
		return nil, fmt.Errorf("%w: %s", ErrPeerLegacy, addr)
	}
	return s.dial(addr, timeout, peerMagic)
}

func (s *identityLayer) dial(addr raft.ServerAddress, timeout time.Duration, magic [4]byte) (net.Conn, error) {
	start := time.Now()
	conn, err := s.inner.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	if magic == identityMagic && s.id.Legacy != nil && s.id.Legacy(string(addr)) {
		return conn, nil
	}
	left := timeout - time.Since(start)
	if timeout <= 0 || left > identityTimeout {
		left = identityTimeout
	}
	conn.SetDeadline(time.Now().Add(left))
	ours := s.local()
	if err := writeHello(conn, magic[:], ours); err != nil {
		conn.Close()
		return nil, fmt.Errorf("raft hello to %s: %w", addr, err)
	}
	var st [1]byte
	if _, err := io.ReadFull(conn, st[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("raft hello to %s: %w", addr, err)
	}
	theirs, err := readID(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("raft hello to %s: %w", addr, err)
	}
	if st[0] != identityOK {
		conn.Close()
		if ours != "" && theirs != "" && ours != theirs {
			s.conflict(string(addr), theirs)
		}
		return nil, fmt.Errorf("%w: %s (cluster %q) refused this server (cluster %q)", ErrOtherCluster, addr, theirs, ours)
	}
	if ours != "" && theirs != "" && ours != theirs {
		conn.Close()
		s.conflict(string(addr), theirs)
		return nil, fmt.Errorf("%w: %s belongs to cluster %q, this server to %q", ErrOtherCluster, addr, theirs, ours)
	}
	if magic == peerMagic && theirs == "" {
		conn.Close()
		return nil, fmt.Errorf("node-to-node stream to %s: it does not know its cluster id yet", addr)
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// hello runs the acceptor's side of the exchange, then hands the connection
// to Accept.
func (s *identityLayer) hello(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(identityTimeout))
	var magic [4]byte
	if _, err := io.ReadFull(conn, magic[:1]); err != nil {
		conn.Close()
		return
	}
	if magic[0] != identityMagic[0] {
		// A peer of a version without the exchange: Raft reads the byte.
		if s.id.Admit != nil {
			if err := s.id.Admit(""); err != nil {
				s.logRefused(conn.RemoteAddr().String(), err)
				conn.Close()
				return
			}
		}
		conn.SetDeadline(time.Time{})
		s.hand(&prefixConn{Conn: conn, first: magic[0], pending: true})
		return
	}
	if _, err := io.ReadFull(conn, magic[1:]); err != nil || magic != identityMagic && magic != peerMagic {
		conn.Close()
		return
	}
	theirs, err := readID(conn)
	if err != nil {
		conn.Close()
		return
	}
	ours := s.local()
	refuse := ours != "" && theirs != "" && ours != theirs
	if refuse {
		s.conflict(conn.RemoteAddr().String(), theirs)
	} else if magic == peerMagic && (ours == "" || theirs == "") {
		// A node-to-node request comes from a server of this cluster: both
		// ends know its id (a server without one yet has nothing to ask).
		refuse = true
	} else if s.id.Admit != nil && magic == identityMagic {
		if err := s.id.Admit(theirs); err != nil {
			refuse = true
			s.logRefused(conn.RemoteAddr().String(), err)
		}
	}
	st := identityOK
	if refuse {
		st = identityRefused
	}
	if err := writeHello(conn, []byte{st}, ours); err != nil || refuse {
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	if magic == peerMagic {
		t := time.NewTimer(identityTimeout)
		defer t.Stop()
		select {
		case s.peers <- conn:
		case <-t.C: // nobody serves node-to-node streams
			conn.Close()
		case <-s.closed:
			conn.Close()
		}
		return
	}
	s.hand(conn)
}

// peerListener is the accepting side of the node-to-node streams.
type peerListener struct {
	s         *identityLayer
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *peerListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.s.peers:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.s.closed:
		return nil, net.ErrClosed
	}
}

// Close stops this listener; the Raft layer is closed by its own Close.
func (l *peerListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *peerListener) Addr() net.Addr { return l.s.Addr() }

// prefixConn gives back the byte read to tell a peer's version.
type prefixConn struct {
	net.Conn
	first   byte
	pending bool
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if c.pending && len(b) > 0 {
		c.pending = false
		b[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(b)
}

func (s *identityLayer) conflict(addr, theirs string) {
	if !s.allowLog() {
		return
	}
	s.log.Warn("raft: refused a connection with a server of another cluster",
		"peer", addr, "peer_cluster", theirs, "cluster", s.local())
	if s.id.OnConflict != nil {
		s.id.OnConflict(addr, theirs)
	}
}

func (s *identityLayer) logRefused(addr string, err error) {
	if s.allowLog() {
		s.log.Warn("raft: refused a connection", "peer", addr, "err", err)
	}
}

// allowLog: at most one line a second.
func (s *identityLayer) allowLog() bool {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	now := time.Now()
	if now.Sub(s.lastLog) < time.Second {
		s.quiet++
		return false
	}
	s.lastLog, s.quiet = now, 0
	return true
}
