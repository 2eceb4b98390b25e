package node

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestReadBarrierTiedToTerm: a server that lost leadership and regained it
// in a later term before the cancellation of the earlier term's context
// reached it (the cluster package cancels it asynchronously) is not ready
// to serve linearizable reads until the new term's barrier has applied:
// its commit index may not yet cover what another leader committed in
// between. The readiness recorded for the earlier term must not be trusted
// in the current one. Simulated through the readiness record: an earlier
// term's, its context still live, while Raft leads in a later term.
func TestReadBarrierTiedToTerm(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	if err := n.readBarrier(ctx, false); err != nil {
		t.Fatalf("read barrier of a ready leader: %v", err)
	}
	ready := n.lt.ready.Load()
	term := n.cl.Term()
	if ready == nil || ready.term != term {
		t.Fatalf("readiness %+v, want the current term %d", ready, term)
	}
	n.lt.ready.Store(&leadership{ctx: context.Background(), term: term - 1})
	if err := n.readBarrier(ctx, false); wire.ErrorCode(err) != wire.CodeNoLeader {
		t.Errorf("read barrier with the readiness of term %d while leading in term %d: %v, want NO_LEADER", term-1, term, err)
	}
	if n.lt.isReady() {
		t.Errorf("leader ready in term %d on the readiness of term %d", term, term-1)
	}
	if err := n.ReadyErr(); err == nil {
		t.Errorf("ready in term %d on the readiness of term %d", term, term-1)
	}
	if _, err := n.GetLease(ctx, "ls_x", false); wire.ErrorCode(err) != wire.CodeNoLeader {
		t.Errorf("linearizable read: %v, want NO_LEADER", err)
	}
	n.lt.ready.Store(ready)
	if err := n.readBarrier(ctx, false); err != nil {
		t.Fatalf("read barrier with the current term's readiness back: %v", err)
	}
}
