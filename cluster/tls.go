package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// TLSConfig turns on mutual TLS for Raft traffic. Every connection, in
// either direction, presents this server's certificate and requires the
// peer's, which must chain to CAs. Host names are not checked: holding a
// certificate issued by CAs is what makes a peer a cluster server, so CAs
// should be a CA dedicated to the cluster's servers.
type TLSConfig struct {
	// Certificate returns this server's certificate. It is called on every
	// handshake, so it may return a reloaded one.
	Certificate func() (*tls.Certificate, error)
	// CAs verify the peers' certificates.
	CAs *x509.CertPool
	// CurrentCAs, if set, is called on every handshake and its pool
	// verifies the peer instead of CAs, so the bundle may be reloaded
	// while the server runs. It must never return nil.
	CurrentCAs func() *x509.CertPool
}

// cas is the pool that verifies a peer now.
func (t *TLSConfig) cas() *x509.CertPool {
	if t.CurrentCAs != nil {
		return t.CurrentCAs()
	}
	return t.CAs
}

// validate reports a TLSConfig that cannot work.
func (t *TLSConfig) validate() error {
	if t.Certificate == nil || (t.CAs == nil && t.CurrentCAs == nil) {
		return fmt.Errorf("%w: raft TLS needs both a certificate and a CA pool", ErrInvalidConfig)
	}
	return nil
}

// tlsHandshakeTimeout bounds a Raft TLS handshake, in either direction.
const tlsHandshakeTimeout = 10 * time.Second

// maxPendingHandshakes bounds the inbound handshakes in progress; more
// connections than that are closed at once (a peer that opens connections
// and never speaks holds one slot each for at most tlsHandshakeTimeout).
const maxPendingHandshakes = 64

// tcpStreamLayer is plain TCP, what raft.NewTCPTransport does, kept as a
// raft.StreamLayer of its own so that TLS (and a test wrapper) can sit on
// it.
type tcpStreamLayer struct {
	net.Listener
	advertise net.Addr
}

// newTCPStreamLayer listens on bind and advertises adv.
func newTCPStreamLayer(bind string, adv net.Addr) (*tcpStreamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	// Port 0 (tests): advertise the port the listener got.
	if la, ok := ln.Addr().(*net.TCPAddr); ok {
		switch a := adv.(type) {
		case *net.TCPAddr:
			if a.Port == 0 {
				adv = &net.TCPAddr{IP: a.IP, Port: la.Port, Zone: a.Zone}
			}
		case nameAddr:
			if host, port, err := net.SplitHostPort(string(a)); err == nil && port == "0" {
				adv = nameAddr(net.JoinHostPort(host, strconv.Itoa(la.Port)))
			}
		}
	}
	return &tcpStreamLayer{Listener: ln, advertise: adv}, nil
}

// nameAddr is an advertised address whose host is a name: peers record
// and dial the name (Dial resolves it every time).
type nameAddr string

func (a nameAddr) Network() string { return "tcp" }
func (a nameAddr) String() string  { return string(a) }

// Dial opens a plain TCP connection; a name in addr is resolved anew.
func (s *tcpStreamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

// Addr is the advertised address (what raft records as this server's).
func (s *tcpStreamLayer) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.Listener.Addr()
}

// tlsStreamLayer is mutual TLS over another stream layer. Accept returns
// only connections whose handshake succeeded: a peer without a certificate
// from the cluster's CA never reaches Raft, and its attempts are logged
// (rate limited) with its address and the reason.
type tlsStreamLayer struct {
	*acceptQueue
	server *tls.Config
	client *tls.Config
	log    *slog.Logger

	// Rejected counts inbound handshakes that failed.
	rejected atomic.Int64
	logMu    sync.Mutex
	lastLog  time.Time
	quiet    int64 // rejections not logged since lastLog
}

// NewTLSStreamLayer wraps inner (which carries the raw connections) in
// mutual TLS. The returned layer owns inner: closing it closes inner.
func NewTLSStreamLayer(inner raft.StreamLayer, cfg *TLSConfig, log *slog.Logger) (raft.StreamLayer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &tlsStreamLayer{acceptQueue: newAcceptQueue(inner), log: log}
	s.server, s.client = mutualTLS(cfg)
	go s.run(maxPendingHandshakes, s.handshake, func(raw net.Conn) {
		s.reject(raw.RemoteAddr(), errors.New("too many handshakes in progress"))
	})
	return s, nil
}

// mutualTLS returns the server and client sides of cfg: TLS 1.3 only (both
// ends are Leasehold servers), a certificate required both ways and
// verified against cfg.CAs, no session resumption (every connection is
// verified afresh).
func mutualTLS(cfg *TLSConfig) (server, client *tls.Config) {
	verify := func(cs tls.ConnectionState) error { return verifyPeer(cs.PeerCertificates, cfg.cas()) }
	server = &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.RequireAnyClientCert, // verified by VerifyConnection
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cfg.Certificate() },
		VerifyConnection:       verify,
		SessionTicketsDisabled: true,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Peers are dialled by address; the chain is verified by
		// VerifyConnection against the cluster CA instead of a host name.
		InsecureSkipVerify:   true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cfg.Certificate() },
		VerifyConnection:     verify,
		ServerName:           "leasehold-raft",
	}
	return server, client
}

// verifyPeer checks that the peer presented a certificate chaining to cas,
// valid now. Any key usage is accepted (a server's certificate serves both
// as client and server).
func verifyPeer(certs []*x509.Certificate, cas *x509.CertPool) error {
	if len(certs) == 0 {
		return errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: cas, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return fmt.Errorf("peer certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	return nil
}

func (s *tlsStreamLayer) handshake(raw net.Conn) {
	conn := tls.Server(raw, s.server)
	ctx, cancel := context.WithTimeout(context.Background(), tlsHandshakeTimeout)
	defer cancel()
	go func() { // a Close ends the handshakes in progress
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := conn.HandshakeContext(ctx); err != nil {
		s.reject(raw.RemoteAddr(), err)
		raw.Close()
		return
	}
	s.hand(conn)
}

// reject records a refused inbound connection. At most one line per second
// is logged, with the count of those not logged since.
func (s *tlsStreamLayer) reject(from net.Addr, err error) {
	s.rejected.Add(1)
	s.logMu.Lock()
	defer s.logMu.Unlock()
	now := time.Now()
	if now.Sub(s.lastLog) < time.Second {
		s.quiet++
		return
	}
	s.log.Warn("raft TLS: refused a connection", "remote", from.String(), "err", err, "not_logged_before", s.quiet)
	s.lastLog, s.quiet = now, 0
}

// Dial connects through the inner layer and completes the mutual TLS
// handshake within timeout.
func (s *tlsStreamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	raw, err := s.inner.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	left := timeout - time.Since(start)
	if timeout <= 0 || left > tlsHandshakeTimeout {
		left = tlsHandshakeTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	conn := tls.Client(raw, s.client)
	if err := conn.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", addr, err)
	}
	return conn, nil
}

// newStreamLayer is the Raft stream layer Open uses: plain TCP on
// cfg.BindAddr advertising adv, in mutual TLS when cfg.TLS is set.
func newStreamLayer(cfg Config, adv net.Addr) (raft.StreamLayer, error) {
	if cfg.TLS != nil {
		if err := cfg.TLS.validate(); err != nil {
			return nil, err
		}
	}
	tcp, err := newTCPStreamLayer(cfg.BindAddr, adv)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft transport on %s: %w", cfg.BindAddr, err)
	}
	if cfg.TLS == nil {
		return tcp, nil
	}
	return NewTLSStreamLayer(tcp, cfg.TLS, cfg.Logger.With("component", "raft-tls"))
}
