package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestRaftErrorNotAppended: Raft errors that prove the entry was never
// appended (the leader refused it while handing leadership on, or it could
// not even be queued in time) are "did not happen", 503 UNAVAILABLE (the
// API adds Retry-After to every 503), not 504 INDETERMINATE; a lost
// leadership stays INDETERMINATE.
func TestRaftErrorNotAppended(t *testing.T) {
	for _, c := range []struct {
		err  error
		want wire.Code
	}{
		{raft.ErrNotLeader, wire.CodeNoLeader},
		{raft.ErrEnqueueTimeout, wire.CodeUnavailable},
		{raft.ErrLeadershipTransferInProgress, wire.CodeUnavailable},
		{fmt.Errorf("apply: %w", raft.ErrLeadershipTransferInProgress), wire.CodeUnavailable},
		{raft.ErrLeadershipLost, wire.CodeIndeterminate},
		{raft.ErrRaftShutdown, wire.CodeIndeterminate},
	} {
		e := raftError(c.err)
		if e.Code != c.want {
			t.Errorf("%v: %s, want %s", c.err, e.Code, c.want)
		}
		if c.want == wire.CodeUnavailable && wire.HTTPStatus(e.Code) != 503 {
			t.Errorf("%v: status %d, want 503", c.err, wire.HTTPStatus(e.Code))
		}
	}
}

// fakeApplyFuture is a failed Apply.
type fakeApplyFuture struct{ err error }

func (f fakeApplyFuture) Error() error  { return f.err }
func (f fakeApplyFuture) Index() uint64 { return 0 }
func (f fakeApplyFuture) Response() any { return nil }

// TestProposeAnswersTransferAsUnavailable: a batch that Raft refused during
// a leadership transfer answers each of its proposers UNAVAILABLE.
func TestProposeAnswersTransferAsUnavailable(t *testing.T) {
	n := &Node{stats: newCounters()}
	n.gc = groupCommit{n: n, inflight: make(chan struct{}, 1)}
	n.gc.inflight <- struct{}{}
	ps := []*proposal{{cmd: &fsm.Tick{}, start: time.Now(), done: make(chan propResult, 1)},
		{cmd: &fsm.Tick{}, start: time.Now(), done: make(chan propResult, 1)}}
	n.gc.await(fakeApplyFuture{raft.ErrLeadershipTransferInProgress}, ps)
	for i, p := range ps {
		r := <-p.done
		if wire.ErrorCode(r.err) != wire.CodeUnavailable {
			t.Fatalf("proposal %d: %v, want UNAVAILABLE", i, r.err)
		}
	}
}
