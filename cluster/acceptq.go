package cluster

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// acceptQueue is the accepting half of a stream layer that checks each
// inbound connection before Raft sees it (mutual TLS, the cluster identity
// exchange): one goroutine accepts from the inner layer, each connection is
// checked in a goroutine of its own (at most maxPending at once; more are
// closed at once), and the ones that pass are handed to Accept.
type acceptQueue struct {
	inner     raft.StreamLayer
	conns     chan net.Conn
	acceptErr chan error
	closed    chan struct{}
	closeOnce sync.Once
	pending   atomic.Int32
}

func newAcceptQueue(inner raft.StreamLayer) *acceptQueue {
	return &acceptQueue{inner: inner, conns: make(chan net.Conn),
		acceptErr: make(chan error, 1), closed: make(chan struct{})}
}

// run accepts until the inner layer fails: check runs for each connection,
// tooMany for one refused because maxPending checks are in progress.
func (q *acceptQueue) run(maxPending int32, check func(net.Conn), tooMany func(net.Conn)) {
	for {
		raw, err := q.inner.Accept()
		if err != nil {
			select {
			case q.acceptErr <- err:
			default:
			}
			return
		}
		if q.pending.Add(1) > maxPending {
			q.pending.Add(-1)
			tooMany(raw)
			raw.Close()
			continue
		}
		go func() {
			defer q.pending.Add(-1)
			check(raw)
		}()
	}
}

// hand passes a connection that passed its check to Accept.
func (q *acceptQueue) hand(conn net.Conn) {
	select {
	case q.conns <- conn:
	case <-q.closed:
		conn.Close()
	}
}

// Accept returns the next inbound connection that passed its check.
func (q *acceptQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case err := <-q.acceptErr:
		q.acceptErr <- err // every later Accept fails too
		return nil, err
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the inner layer.
func (q *acceptQueue) Close() error {
	var err error
	q.closeOnce.Do(func() {
		close(q.closed)
		err = q.inner.Close()
	})
	return err
}

// Addr is the inner layer's (advertised) address.
func (q *acceptQueue) Addr() net.Addr { return q.inner.Addr() }
