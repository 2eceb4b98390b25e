package node

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
)

type proposal struct {
	// ctx is the proposer's: the batcher drops a proposal whose ctx has
	// ended before it reaches Raft (a leadership term's ctx ends with
	// the term, so an ended term proposes nothing more).
	ctx   context.Context
	cmd   fsm.Command
	start time.Time
	done  chan propResult
}

type propResult struct {
	res   fsm.Result
	index uint64
	err   error
}

// propose commits cmd through Raft and returns its result once it has been
// applied on this node. Errors are *Error: NO_LEADER when the command was
// certainly not applied, INDETERMINATE when it may have been; UNAVAILABLE
// (not applied) on a server the cluster removed or whose id belongs to
// another cluster (refusedErr): it writes nothing, not even as the leader
// of a cluster of its own.
func (n *Node) propose(ctx context.Context, cmd fsm.Command) (fsm.Result, uint64, error) {
	if err := n.refusedErr(); err != nil {
		return fsm.Result{}, 0, &Error{Code: fsm.CodeUnavailable, Message: err.Error()}
	}
	p := &proposal{ctx: ctx, cmd: cmd, start: time.Now(), done: make(chan propResult, 1)}
	select {
	case <-n.closing:
		return fsm.Result{}, 0, errShuttingDown()
	default:
	}
	if err := ctx.Err(); err != nil {
		return fsm.Result{}, 0, err
	}
	select {
	case n.propCh <- p:
	case <-ctx.Done():
		return fsm.Result{}, 0, ctx.Err()
	case <-n.closing:
		return fsm.Result{}, 0, errShuttingDown()
	}
	// Commit normally takes milliseconds; a stalled disk or a lost quorum
	// must not hold the caller forever.
	timer := time.NewTimer(2 * n.cfg.ApplyTimeout)
	defer timer.Stop()
	select {
	case r := <-p.done:
		return r.res, r.index, r.err
	case <-ctx.Done():
		return fsm.Result{}, 0, &Error{Code: CodeIndeterminate, Message: "the request was abandoned after it was proposed; it may or may not have been applied"}
	case <-timer.C:
		return fsm.Result{}, 0, &Error{Code: CodeIndeterminate, Message: "the write was not committed in time; it may or may not be applied later"}
	case <-n.closing:
		// The batcher answers what it never sent; this one may be in Raft.
		select {
		case r := <-p.done:
			return r.res, r.index, r.err
		case <-time.After(n.cfg.ApplyTimeout):
			return fsm.Result{}, 0, &Error{Code: CodeIndeterminate, Message: "node shut down while the write was in flight; it may or may not have been applied"}
		}
	}
}

func errShuttingDown() *Error {
	return &Error{Code: CodeUnavailable, Message: "node is shutting down"}
}

// drain answers every proposal still queued at shutdown: none was sent to
// Raft, so "not applied" is certain.
func (n *Node) drain() {
	for {
		select {
		case p := <-n.propCh:
			p.done <- propResult{err: errShuttingDown()}
		default:
			return
		}
	}
}

// batcher is group commit: it takes whatever proposals are waiting (up to
// MaxBatch) into one log entry. At most cap(inflight) entries are in flight;
// while they are, new proposals queue and the next entry gets them all.
func (n *Node) batcher() {
	defer n.wg.Done()
	defer n.drain()
	batch := make([]*proposal, 0, n.cfg.MaxBatch)
	// carry is an Expire taken while collecting a batch that had one
	// already: it starts the next batch, so that each entry ends at most
	// one chunk of expiries (drainExpiry keeps two in flight).
	var carry *proposal
	for {
		select {
		case n.inflight <- struct{}{}:
		case <-n.closing:
			if carry != nil {
				carry.done <- propResult{err: errShuttingDown()}
			}
			return
		}
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-n.propCh:
			case <-n.closing:
				return
			}
		}
		batch = append(batch[:0], first)
		expiring := isExpire(first)
	collect:
		for len(batch) < n.cfg.MaxBatch {
			select {
			case p := <-n.propCh:
				if isExpire(p) {
					if expiring {
						carry = p
						break collect
					}
					expiring = true
				}
				batch = append(batch, p)
			default:
				break collect
			}
		}
		// Drop what was abandoned while it queued, checked after the whole
		// batch is taken: whatever a new leadership term proposes was
		// queued after the previous term's ctx ended, so no proposal of an
		// ended term can follow it into the log.
		batch = n.dropAbandoned(batch)
		if len(batch) == 0 {
			<-n.inflight
			continue
		}
		var cmd fsm.Command = batch[0].cmd
		if len(batch) > 1 {
			b := &fsm.Batch{Commands: make([]fsm.Command, len(batch))}
			for i, p := range batch {
				b.Commands[i] = p.cmd
			}
			cmd = b
		}
		data, err := fsm.Encode(cmd)
		if err != nil {
			for _, p := range batch {
				p.done <- propResult{err: &Error{Code: CodeInternal, Message: "encode command: " + err.Error()}}
			}
			<-n.inflight
			continue
		}
		fut := n.cl.Raft.Apply(data, n.cfg.ApplyTimeout)
		go n.await(fut, append([]*proposal(nil), batch...))
	}
}

func isExpire(p *proposal) bool {
	_, ok := p.cmd.(*fsm.Expire)
	return ok
}

// dropAbandoned answers and removes the proposals whose ctx has ended; none
// was sent to Raft.
func (n *Node) dropAbandoned(batch []*proposal) []*proposal {
	kept := batch[:0]
	for _, p := range batch {
		if p.ctx != nil && p.ctx.Err() != nil {
			p.done <- propResult{err: &Error{Code: CodeNoLeader, Message: "the request was abandoned before it was proposed; it was not applied"}}
			continue
		}
		kept = append(kept, p)
	}
	clear(batch[len(kept):])
	return kept
}

func (n *Node) await(fut raft.ApplyFuture, batch []*proposal) {
	err := fut.Error()
	<-n.inflight
	if err != nil {
		e := raftError(err)
		for _, p := range batch {
			p.done <- propResult{err: e}
		}
		return
	}
	results, _ := fut.Response().([]fsm.Result)
	now := time.Now()
	for i, p := range batch {
		n.stats.observeApply(now.Sub(p.start))
		if i >= len(results) {
			p.done <- propResult{err: &Error{Code: CodeInternal, Message: "missing apply result"}}
			continue
		}
		p.done <- propResult{res: results[i], index: fut.Index()}
	}
}

// raftError classifies a failed Apply: only ErrNotLeader proves the entry
// was never appended.
func raftError(err error) *Error {
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		return &Error{Code: CodeNoLeader, Message: "this node is not the leader"}
	case errors.Is(err, raft.ErrLeadershipLost):
		return &Error{Code: CodeIndeterminate, Message: "leadership was lost while the write was in flight; it may or may not have been applied"}
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return &Error{Code: CodeIndeterminate, Message: "timed out waiting to propose the write"}
	default:
		return &Error{Code: CodeIndeterminate, Message: "the write may or may not have been applied: " + err.Error()}
	}
}
