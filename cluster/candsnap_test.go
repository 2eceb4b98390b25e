package cluster

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

type fakeRaft struct {
	state atomic.Uint32
	term  atomic.Uint64
}

func (f *fakeRaft) State() raft.RaftState { return raft.RaftState(f.state.Load()) }
func (f *fakeRaft) CurrentTerm() uint64   { return f.term.Load() }

// rpcOf is an RPC carrying cmd and the channel its answer arrives on.
func rpcOf(cmd any) (raft.RPC, chan raft.RPCResponse) {
	ch := make(chan raft.RPCResponse, 1)
	return raft.RPC{Command: cmd, RespChan: ch}, ch
}

// A snapshot of the current term reaching a candidate is refused, with an
// answer to its sender; the same snapshot reaching a follower, one of a
// later term reaching a candidate, and any other RPC reach Raft.
func TestSnapshotGateRefusesCandidateSnapshot(t *testing.T) {
	in := make(chan raft.RPC)
	g := newSnapshotGate(in)
	defer g.close()
	out := g.consumer()
	f := &fakeRaft{}
	f.term.Store(2)

	through := func(name string, cmd any) {
		t.Helper()
		rpc, _ := rpcOf(cmd)
		in <- rpc
		select {
		case got := <-out:
			if got.Command != cmd {
				t.Fatalf("%s: another RPC came through", name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not handed to Raft", name)
		}
	}
	snap := &raft.InstallSnapshotRequest{Term: 2}
	through("before Raft runs", snap)
	g.setRaft(f)
	f.state.Store(uint32(raft.Follower))
	through("a follower's snapshot", snap)
	f.state.Store(uint32(raft.Candidate))
	through("a candidate's append", &raft.AppendEntriesRequest{Term: 2})
	through("a candidate's snapshot of a later term", &raft.InstallSnapshotRequest{Term: 3})

	rpc, answer := rpcOf(snap)
	in <- rpc
	select {
	case resp := <-answer:
		if !errors.Is(resp.Error, errCandidateSnapshot) {
			t.Fatalf("refused with %v, want errCandidateSnapshot", resp.Error)
		}
	case got := <-out:
		t.Fatalf("a candidate's snapshot of its own term reached Raft: %+v", got.Command)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the refused snapshot")
	}
	through("the next RPC", &raft.AppendEntriesRequest{Term: 2})
}

// An RPC the gate took and had not handed to Raft when it closes is
// answered with the transport's shutdown and an empty response of its
// type (the in-memory pipeline reads an append's response before its
// error).
func TestSnapshotGateCloseAnswersTyped(t *testing.T) {
	in := make(chan raft.RPC)
	g := newSnapshotGate(in)
	g.consumer() // never read
	rpc, answer := rpcOf(&raft.AppendEntriesRequest{Term: 2})
	in <- rpc // taken: the gate now waits to hand it on
	g.close()
	select {
	case resp := <-answer:
		if _, ok := resp.Response.(*raft.AppendEntriesResponse); !ok || !errors.Is(resp.Error, raft.ErrTransportShutdown) {
			t.Fatalf("answered %T, %v; want *raft.AppendEntriesResponse, ErrTransportShutdown", resp.Response, resp.Error)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer once the gate closed")
	}
}
