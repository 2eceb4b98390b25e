package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// pipelineTransport is Raft's TCP transport with pipelined replication that
// cannot wedge.
//
// In hashicorp/raft, when a follower rejects a pipelined append the
// decoder stops reading answers, the transport blocks, the sender blocks
// forever, and that follower never gets another entry (hashicorp/raft#612).
// Here every pipeline's answers are read by a goroutine of ours as soon as
// they arrive and queued for Raft, so neither the transport nor the sender
// blocks, and the sender sees the decoder finish and closes the pipeline.
//
// Its RPCs reach Raft through a snapshotGate (candsnap.go).
type pipelineTransport struct {
	*raft.NetworkTransport
	gate *snapshotGate
}

func newPipelineTransport(nt *raft.NetworkTransport) *pipelineTransport {
	return &pipelineTransport{NetworkTransport: nt, gate: newSnapshotGate(nt.Consumer())}
}

// Consumer implements raft.Transport: the RPCs the gate lets through.
func (t *pipelineTransport) Consumer() <-chan raft.RPC { return t.gate.consumer() }

// Close implements raft.WithClose: the gate, then the transport.
func (t *pipelineTransport) Close() error {
	t.gate.close()
	return t.NetworkTransport.Close()
}

// AppendEntriesPipeline implements raft.Transport.
func (t *pipelineTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return newDrainedPipeline(p), nil
}

// drainedPipeline wraps an AppendPipeline: a goroutine always takes the
// inner pipeline's answers and keeps them, in order, until Raft reads them
// from Consumer or the pipeline is closed. It holds at most what was sent
// and not yet read, so no more than the requests in flight while Raft
// reads, and a handful after it has stopped reading.
type drainedPipeline struct {
	inner raft.AppendPipeline
	out   chan raft.AppendFuture
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newDrainedPipeline(inner raft.AppendPipeline) *drainedPipeline {
	p := &drainedPipeline{inner: inner, out: make(chan raft.AppendFuture),
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.pump()
	return p
}

// pump moves answers from the inner pipeline to out through a queue.
func (p *drainedPipeline) pump() {
	defer close(p.done)
	in := p.inner.Consumer()
	var queue []raft.AppendFuture
	for {
		var send chan raft.AppendFuture
		var head raft.AppendFuture
		if len(queue) > 0 {
			send, head = p.out, queue[0]
		}
		select {
		case f := <-in:
			queue = append(queue, f)
		case send <- head:
			queue[0] = nil
			queue = queue[1:]
		case <-p.stop:
			return
		}
	}
}

// AppendEntries implements raft.AppendPipeline.
func (p *drainedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	return p.inner.AppendEntries(args, resp)
}

// Consumer implements raft.AppendPipeline.
func (p *drainedPipeline) Consumer() <-chan raft.AppendFuture { return p.out }

// Close implements raft.AppendPipeline: it closes the inner pipeline and
// ends the pump. Answers not read are dropped, as the inner pipeline's
// own Close does.
func (p *drainedPipeline) Close() error {
	err := p.inner.Close()
	p.once.Do(func() { close(p.stop) })
	<-p.done
	return err
}

// raftMaxRPCsInFlight is how many AppendEntries may be outstanding to one
// follower: 1 turns pipelining off, 2 overlaps sending the next with
// waiting for the previous answer.
const raftMaxRPCsInFlight = 2
