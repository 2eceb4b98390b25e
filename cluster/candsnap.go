package cluster

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// A candidate that takes a snapshot of its own term never votes again.
//
// hashicorp/raft's installSnapshot, unlike appendEntries, does not turn a
// candidate of the request's term into a follower: it records the sender
// as the known leader and leaves the server a candidate. A server whose
// pre-vote had begun (pre-vote does not raise the term) when a leader's
// snapshot reached it is then a candidate that knows a leader; it clears
// that leader only on a move to follower, which no election timeout makes.
// When the leader is lost during the install (the chaos suite's
// snapshot-install-leader-lost, cut and killed mid-snapshot), that server
// refuses every other server's (pre-)vote "since we have a leader" for as
// long as it runs on, and when the others need its vote no leader is ever
// elected (seen: 35 s without one, until the old leader came back).
//
// snapshotGate sits between the transport and Raft: an InstallSnapshot of
// the current term that reaches a candidate is refused instead (the
// leader retries it; its heartbeats, an appendEntries of that term, make
// the candidate a follower first). Any other RPC passes as it came.
type snapshotGate struct {
	state atomic.Pointer[raftStater] // nil until Raft runs: nothing refused
	in    <-chan raft.RPC
	out   chan raft.RPC
	start sync.Once
	stop  chan struct{}
	once  sync.Once
}

// raftStater is what the gate reads of Raft.
type raftStater interface {
	State() raft.RaftState
	CurrentTerm() uint64
}

// errCandidateSnapshot answers the refused InstallSnapshot.
var errCandidateSnapshot = errors.New("cluster: refusing a snapshot of the current term while a candidate " +
	"(it would keep its sender as leader and refuse every vote); retry once a heartbeat made this server a follower")

func newSnapshotGate(in <-chan raft.RPC) *snapshotGate {
	return &snapshotGate{in: in, out: make(chan raft.RPC), stop: make(chan struct{})}
}

// setRaft has the gate read r's state from now on.
func (g *snapshotGate) setRaft(r raftStater) { g.state.Store(&r) }

// consumer is the channel Raft reads its RPCs from.
func (g *snapshotGate) consumer() <-chan raft.RPC {
	g.start.Do(func() { go g.pass() })
	return g.out
}

// close ends the gate; an RPC taken and not handed on is answered with
// the transport's shutdown.
func (g *snapshotGate) close() { g.once.Do(func() { close(g.stop) }) }

func (g *snapshotGate) pass() {
	for {
		select {
		case rpc := <-g.in:
			if g.refuse(rpc) {
				continue
			}
			select {
			case g.out <- rpc:
			case <-g.stop:
				rpc.Respond(zeroResponse(rpc.Command), raft.ErrTransportShutdown)
				return
			}
		case <-g.stop:
			return
		}
	}
}

// zeroResponse is an empty response of the type that answers cmd: the
// in-memory transport's pipeline reads an append's response before its
// error.
func zeroResponse(cmd any) any {
	switch cmd.(type) {
	case *raft.AppendEntriesRequest:
		return &raft.AppendEntriesResponse{}
	case *raft.RequestVoteRequest:
		return &raft.RequestVoteResponse{}
	case *raft.RequestPreVoteRequest:
		return &raft.RequestPreVoteResponse{}
	case *raft.InstallSnapshotRequest:
		return &raft.InstallSnapshotResponse{}
	case *raft.TimeoutNowRequest:
		return &raft.TimeoutNowResponse{}
	}
	return nil
}

// refuse answers rpc with errCandidateSnapshot when it is an
// InstallSnapshot of the current term and Raft is a candidate.
func (g *snapshotGate) refuse(rpc raft.RPC) bool {
	req, ok := rpc.Command.(*raft.InstallSnapshotRequest)
	if !ok || canaryNoSnapshotGate {
		return false
	}
	p := g.state.Load()
	if p == nil {
		return false
	}
	s := *p
	if s.State() != raft.Candidate || req.Term != s.CurrentTerm() {
		return false
	}
	rpc.Respond(nil, errCandidateSnapshot)
	return true
}

// gatedInmem is Raft's in-memory transport with its RPCs passed through a
// snapshotGate, as the network transport's are: the same interleaving
// reaches Raft over either. Peers are connected as with
// raft.InmemTransport (Connect takes a gatedInmem or a raw one).
type gatedInmem struct {
	*raft.InmemTransport
	gate *snapshotGate
}

func newGatedInmem(t *raft.InmemTransport) *gatedInmem {
	return &gatedInmem{InmemTransport: t, gate: newSnapshotGate(t.Consumer())}
}

// Consumer implements raft.Transport: the RPCs the gate lets through.
func (t *gatedInmem) Consumer() <-chan raft.RPC { return t.gate.consumer() }

// Connect implements raft.WithPeers. A peer's RPCs are handed to its
// in-memory transport, whose consumer its gate reads: other may be a
// gatedInmem, a raw in-memory transport, or a wrapper of either that
// unwraps (Unwrap() raft.Transport); anything else panics in Raft.
func (t *gatedInmem) Connect(peer raft.ServerAddress, other raft.Transport) {
	for {
		if g, ok := other.(*gatedInmem); ok {
			other = g.InmemTransport
		}
		u, ok := other.(interface{ Unwrap() raft.Transport })
		if !ok {
			break
		}
		other = u.Unwrap()
	}
	t.InmemTransport.Connect(peer, other)
}

// Close implements raft.WithClose: the gate, then the transport.
func (t *gatedInmem) Close() error {
	t.gate.close()
	return t.InmemTransport.Close()
}
