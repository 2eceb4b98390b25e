package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// A Raft message that stops arriving halfway.
//
// hashicorp/raft's NetworkTransport sets no read deadline on the
// connections it accepts. For most messages that costs a goroutine: the
// connection's own goroutine decodes the request before Raft sees it. But
// a snapshot (InstallSnapshot) is read by Raft's main loop itself, from the
// connection, as it is copied to disk: a leader that vanishes in the middle
// without a FIN or RST (its network cut, its power lost) leaves the
// follower's main loop blocked in that read, deaf to heartbeat timeouts and
// vote requests, until TCP keep-alive gives up (minutes), or for good
// behind a proxy that keeps its side open; the cluster may need its vote.
//
// stallLayer bounds it: once a message has started to arrive on an
// accepted connection, every read must get a byte within the stall
// timeout, or the connection fails (for good) and Raft drops it; the next
// leader sends the snapshot again. A connection idle between messages
// (Raft's pooled connections) is left alone. A message has started when a
// byte arrived after this side last wrote: requests on a pooled connection
// take turns with their answers. On the pipelined
// connection a request may already be partly read when the previous answer
// goes out; that request is then not timed, which costs at most that
// connection's goroutine (Raft's main loop never reads it).
//
// The connections Raft dials are left alone too: the transport sets a
// deadline on every call it makes (Timeout, scaled by the size for a
// snapshot).
type stallLayer struct {
	raft.StreamLayer
	timeout time.Duration
	log     *slog.Logger
}

// newStallLayer wraps s; timeout > 0.
func newStallLayer(s raft.StreamLayer, timeout time.Duration, log *slog.Logger) *stallLayer {
	return &stallLayer{StreamLayer: s, timeout: timeout, log: log}
}

// Accept implements net.Listener.
func (s *stallLayer) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, layer: s}, nil
}

// errStalled is what reads on a connection whose message stalled fail with
// (it wraps os.ErrDeadlineExceeded).
var errStalled = errors.New("cluster: raft message stalled")

// stallConn is an accepted connection whose reads are timed while a
// message arrives.
type stallConn struct {
	net.Conn
	layer *stallLayer

	mu      sync.Mutex
	started bool  // a byte arrived since this side last wrote
	timed   bool  // a read deadline is set on Conn
	err     error // once stalled, every read fails with it
}

// Read implements net.Conn.
func (c *stallConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	started := c.started
	if started {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.layer.timeout)); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		c.timed = true
	} else if c.timed {
		if err := c.Conn.SetReadDeadline(time.Time{}); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		c.timed = false
	}
	c.mu.Unlock()

	n, err := c.Conn.Read(b)

	c.mu.Lock()
	defer c.mu.Unlock()
	if n > 0 {
		c.started = true
	}
	if err != nil && started && n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		c.err = fmt.Errorf("%w: nothing arrived from %s for %v in the middle of a message (%w)",
			errStalled, c.Conn.RemoteAddr(), c.layer.timeout, err)
		c.layer.log.Warn("raft: dropping a connection whose message stopped arriving",
			"peer", c.Conn.RemoteAddr().String(), "stall_timeout", c.layer.timeout)
		return 0, c.err
	}
	return n, err
}

// Write implements net.Conn: this side answers, so the request has
// arrived; the next byte starts the next one.
func (c *stallConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.started = false
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// newNetworkTransport is Raft's TCP transport over stream, with the stall
// timeout on the connections it accepts (cfg with its defaults filled in;
// a negative StallTimeout: none).
func newNetworkTransport(stream raft.StreamLayer, cfg Config) *raft.NetworkTransport {
	if cfg.StallTimeout > 0 {
		stream = newStallLayer(stream, cfg.StallTimeout, cfg.Logger.With("component", "raft-transport"))
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream, MaxPool: 8,
		MaxRPCsInFlight: raftMaxRPCsInFlight, Timeout: 10 * time.Second, Logger: newHCLogger("transport", cfg.Logger)})
}
