package cluster

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// countingLayer counts the connections a stream layer accepted.
type countingLayer struct {
	raft.StreamLayer
	accepts atomic.Int64
}

func (l *countingLayer) Accept() (net.Conn, error) {
	c, err := l.StreamLayer.Accept()
	if err == nil {
		l.accepts.Add(1)
	}
	return c, err
}

// stallServer is Raft's transport as Open builds it (newNetworkTransport)
// on a loopback port, with the given stall timeout.
func stallServer(t *testing.T, stall time.Duration) (*raft.NetworkTransport, *countingLayer) {
	t.Helper()
	tcp, err := newTCPStreamLayer("127.0.0.1:0", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	counting := &countingLayer{StreamLayer: tcp}
	nt := newNetworkTransport(counting, Config{StallTimeout: stall}.withDefaults())
	t.Cleanup(func() { nt.Close() })
	return nt, counting
}

// stallClient is a plain Raft TCP transport to call the server with;
// timeout 0: its calls have no deadline of their own.
func stallClient(t *testing.T, timeout time.Duration) *raft.NetworkTransport {
	t.Helper()
	nt, err := raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, &raft.NetworkTransportConfig{
		MaxPool: 2, Timeout: timeout, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nt.Close() })
	return nt
}

// silentAfter gives n bytes, then blocks until released (a sender that went
// silent without closing its connection), then fails.
type silentAfter struct {
	n       int
	release chan struct{}
}

func (r *silentAfter) Read(b []byte) (int, error) {
	if r.n > 0 {
		k := min(len(b), r.n)
		clear(b[:k])
		r.n -= k
		return k, nil
	}
	<-r.release
	return 0, io.ErrUnexpectedEOF
}

// A leader that goes silent in the middle of a snapshot, its connection
// left open: the follower's read of the snapshot, which Raft's main loop
// does, must fail once nothing arrived for the stall timeout, instead of
// blocking until the connection closes (never, here).
func TestStallTimeoutFreesSnapshotRead(t *testing.T) {
	const stall = 200 * time.Millisecond
	srv, _ := stallServer(t, stall)
	cli := stallClient(t, 0)

	data := &silentAfter{n: 64 << 10, release: make(chan struct{})}
	const size = 1 << 20
	sent := make(chan error, 1)
	go func() {
		var resp raft.InstallSnapshotResponse
		sent <- cli.InstallSnapshot("srv", srv.LocalAddr(), &raft.InstallSnapshotRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("cli"), Addr: []byte(cli.LocalAddr())}, SnapshotVersion: raft.SnapshotVersionMax,
			Term: 2, LastLogIndex: 100, LastLogTerm: 2, Size: size}, &resp, data)
	}()
	t.Cleanup(func() {
		close(data.release)
		select {
		case <-sent:
		case <-time.After(30 * time.Second):
			t.Error("the sender did not return after its data ended")
		}
	})

	var rpc raft.RPC
	select {
	case rpc = <-srv.Consumer():
	case <-time.After(30 * time.Second):
		t.Fatal("no InstallSnapshot request arrived within 30 s")
	}
	if _, ok := rpc.Command.(*raft.InstallSnapshotRequest); !ok || rpc.Reader == nil {
		t.Fatalf("got %T (reader %v), want an InstallSnapshotRequest with its data", rpc.Command, rpc.Reader != nil)
	}
	type result struct {
		n   int64
		err error
	}
	copied := make(chan result, 1)
	start := time.Now()
	go func() {
		n, err := io.Copy(io.Discard, rpc.Reader) // what Raft's main loop does with it
		copied <- result{n, err}
	}()
	var r result
	select {
	case r = <-copied:
	case <-time.After(30 * time.Second):
		t.Fatalf("the snapshot read is still blocked 30 s after its sender went silent (stall timeout %v)", stall)
	}
	rpc.Respond(nil, r.err)
	t.Logf("read %d of %d bytes, then failed after %v: %v", r.n, size, time.Since(start).Round(time.Millisecond), r.err)
	if r.n >= size {
		t.Fatalf("read all %d bytes; the sender sent %d", r.n, 64<<10)
	}
	if !errors.Is(r.err, errStalled) || !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("the read failed with %v, want the stall error", r.err)
	}
}

// Connections idle between messages are not timed: Raft's pooled
// connections (and a follower's heartbeat connection between heartbeats)
// sit idle for long; a call on one after a long pause must still be
// answered, on the same connection.
func TestStallTimeoutLeavesIdleConnections(t *testing.T) {
	const stall = 100 * time.Millisecond
	srv, counting := stallServer(t, stall)
	cli := stallClient(t, 10*time.Second)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case rpc := <-srv.Consumer():
				rpc.Respond(&raft.AppendEntriesResponse{Term: 2, Success: true}, nil)
			case <-done:
				return
			}
		}
	}()
	call := func(k int) {
		t.Helper()
		var resp raft.AppendEntriesResponse
		err := cli.AppendEntries("srv", srv.LocalAddr(), &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("cli"), Addr: []byte(cli.LocalAddr())}, Term: 2,
			PrevLogEntry: uint64(k), PrevLogTerm: 2, LeaderCommitIndex: uint64(k),
			Entries: []*raft.Log{{Index: uint64(k + 1), Term: 2, Type: raft.LogCommand, Data: []byte("x")}}}, &resp)
		if err != nil || !resp.Success {
			t.Fatalf("call %d: %v (success %v)", k, err, resp.Success)
		}
	}
	call(1)
	time.Sleep(5 * stall) // idle for five stall timeouts at least: the idleness under test
	call(2)
	time.Sleep(5 * stall) // the same, once more
	call(3)
	if n := counting.accepts.Load(); n != 1 {
		t.Fatalf("the server accepted %d connections for 3 calls on one pooled connection: an idle one was dropped", n)
	}
}

func TestStallTimeoutDefault(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{}, 5 * time.Second},
		{Config{HeartbeatTimeout: time.Second}, 10 * time.Second},
		{Config{StallTimeout: 3 * time.Second}, 3 * time.Second},
		{Config{StallTimeout: -1}, -1},
	} {
		if got := tc.cfg.withDefaults().StallTimeout; got != tc.want {
			t.Errorf("%+v: stall timeout %v, want %v", tc.cfg, got, tc.want)
		}
	}
}
