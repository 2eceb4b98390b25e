package node

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// groupCommit is the batcher: proposals queue on propCh, and at most
// entriesInFlight log entries carry them to Raft at a time.
type groupCommit struct {
	cfg     *Config
	rep     *replica
	stats   *counters
	cl      *cluster.Cluster // set once Raft runs
	wg      *sync.WaitGroup  // the node's goroutines
	closing <-chan struct{}
	// recorded and featureOK say whether the state records a feature,
	// or every server of ids reads it (the entries' checksum).
	recorded  func(fsm.Features) bool
	featureOK func(fsm.Features, []string) bool

	propCh   chan *proposal
	inflight chan struct{}
	// crcOK: every server of the configuration reads entries with a
	// checksum (updateEntryCRC), so the leader writes them.
	crcOK atomic.Bool
	// lingering: the batcher holds an entry for a companion (tests).
	lingering atomic.Bool
	// renewed and renewTimer are the batcher's (run): the leases the
	// renewals of the last entry renewed (awaitRenewals).
	renewed    map[string]struct{}
	renewTimer *time.Timer
	renewSkip  int
	// carry is a unit taken that did not fit the entry (MaxBatch
	// commands): the next entry starts with it (run's).
	carry *proposal
}

// entriesInFlight is how many log entries of proposals the batcher has in
// Raft at once. One, so that what queues while an entry commits goes into
// the next one whole and each append's fsync carries as many proposals as
// possible (faster than 2 in `leasehold bench`).
const entriesInFlight = 1

type proposal struct {
	// ctx is the proposer's: the batcher drops a proposal whose ctx has
	// ended before it reaches Raft (a leadership term's ctx ends with
	// the term, so an ended term proposes nothing more).
	ctx context.Context
	cmd fsm.Command
	// unit, when not nil, are several commands proposed together
	// (proposeUnit; cmd is nil): they go into one entry, never split, and
	// are answered with one propResult that holds each one's result.
	unit  []fsm.Command
	one   [1]fsm.Command // commands' slice of cmd alone
	start time.Time
	done  chan propResult
	// timer bounds the proposer's wait (propose); reused with p.
	timer *time.Timer
}

// proposals reuses a proposal, its answer channel and its timer once its
// answer has been received (a proposal abandoned with an answer still to
// come is left to the garbage collector).
var proposals = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &proposal{done: make(chan propResult, 1), timer: t}
}}

// newProposal is a proposal of cmd for ctx, from the pool.
func newProposal(ctx context.Context, cmd fsm.Command) *proposal {
	p := proposals.Get().(*proposal)
	p.ctx, p.cmd, p.start = ctx, cmd, time.Now()
	return p
}

// recycle puts p back in the pool: only once nothing will send on p.done
// (its answer was received, or it never reached the batcher) and its timer
// is stopped (timers since Go 1.23 deliver nothing stale after Stop).
func (p *proposal) recycle() {
	p.timer.Stop()
	p.ctx, p.cmd, p.unit, p.one[0] = nil, nil, nil, nil
	proposals.Put(p)
}

// commands are p's commands: its unit, or cmd alone.
func (p *proposal) commands() []fsm.Command {
	if p.unit != nil {
		return p.unit
	}
	p.one[0] = p.cmd
	return p.one[:]
}

// size is how many commands p puts into its entry.
func (p *proposal) size() int {
	if p.unit != nil {
		return len(p.unit)
	}
	return 1
}

type propResult struct {
	res fsm.Result
	// unit: a unit's results, in order (res is then empty).
	unit  []fsm.Result
	index uint64
	err   error
}

// propose commits cmd through Raft and returns its result once it has been
// applied on this node. Errors are *Error: NO_LEADER or UNAVAILABLE when
// the command was certainly not applied (raftError), INDETERMINATE when it
// may have been; OUT_OF_SERVICE (not applied) on a server out of service
// (Gate: the cluster removed it or its id belongs to another cluster, its
// state diverged, its log is damaged): it writes nothing, not even as the
// leader of a cluster of its own.
func (n *Node) propose(ctx context.Context, cmd fsm.Command) (fsm.Result, uint64, error) {
	p := newProposal(ctx, cmd)
	r := n.submit(ctx, p)
	return r.res, r.index, r.err
}

// proposeUnit commits cmds (1..MaxBatch of them) through Raft in one entry,
// never split, and returns their results once applied on this node, in
// order, and the entry's index; an error (as propose's) is every command's.
func (n *Node) proposeUnit(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, uint64, error) {
	p := newProposal(ctx, nil)
	p.unit = cmds
	r := n.submit(ctx, p)
	return r.unit, r.index, r.err
}

// submit hands p to the batcher and waits for its answer; it recycles p
// once the batcher is done with it.
func (n *Node) submit(ctx context.Context, p *proposal) propResult {
	if err := n.Gate(); err != nil {
		p.recycle()
		return propResult{err: err}
	}
	select {
	case <-n.closing:
		p.recycle()
		return propResult{err: errShuttingDown()}
	default:
	}
	if err := ctx.Err(); err != nil {
		p.recycle()
		return propResult{err: err}
	}
	select {
	case n.gc.propCh <- p:
	case <-ctx.Done():
		p.recycle()
		return propResult{err: ctx.Err()}
	case <-n.closing:
		p.recycle()
		return propResult{err: errShuttingDown()}
	}
	p.timer.Reset(2 * n.cfg.ApplyTimeout)
	select {
	case r := <-p.done:
		// Answered: the batcher is done with p (it sends one answer).
		p.recycle()
		return r
	case <-ctx.Done():
		// Not answered: p is not recycled, as its answer may still come.
		p.timer.Stop()
		return propResult{err: &wire.Error{Code: wire.CodeIndeterminate, Message: "the request was abandoned after it was proposed; it may or may not have been applied"}}
	case <-p.timer.C:
		return propResult{err: &wire.Error{Code: wire.CodeIndeterminate, Message: "the write was not committed in time; it may or may not be applied later"}}
	case <-n.closing:
		p.timer.Stop()
		// The batcher answers what it never sent; this one may be in Raft.
		select {
		case r := <-p.done:
			p.recycle()
			return r
		case <-time.After(n.cfg.ApplyTimeout):
			return propResult{err: &wire.Error{Code: wire.CodeIndeterminate, Message: "node shut down while the write was in flight; it may or may not have been applied"}}
		}
	}
}

// drain answers every proposal still queued at shutdown: none was sent to
// Raft, so "not applied" is certain.
func (gc *groupCommit) drain() {
	if gc.carry != nil {
		gc.carry.done <- propResult{err: errShuttingDown()}
		gc.carry = nil
	}
	for {
		select {
		case p := <-gc.propCh:
			p.done <- propResult{err: errShuttingDown()}
		default:
			return
		}
	}
}

// batcher is group commit: it takes whatever proposals are waiting (up to
// MaxBatch) into one log entry. At most entriesInFlight entries are in flight;
// while they are, new proposals queue and the next entry gets them all.
func (gc *groupCommit) run() {
	defer gc.wg.Done()
	defer gc.drain()
	batch := make([]*proposal, 0, gc.cfg.MaxBatch)
	// held are Expire proposals taken but not yet sent (at most
	// expireDepth: drainExpiry keeps that many in flight). An Expire goes
	// into an entry of its own, and entries of other proposals and of
	// held Expires alternate (expireNext), so that a write waits behind at
	// most one chunk of expiries, not the chunk applying and then another
	// in its own entry.
	var held []*proposal
	expireNext := false
	for {
		select {
		case gc.inflight <- struct{}{}:
		case <-gc.closing:
			for _, p := range held {
				p.done <- propResult{err: errShuttingDown()}
			}
			return
		}
		batch = batch[:0]
		// size counts the batch's commands (a unit's each).
		size := 0
		// take adds p to the batch, or holds it (an Expire), or carries
		// it to the next entry (a unit that does not fit this one).
		take := func(p *proposal) {
			if isExpire(p) {
				held = append(held, p)
				return
			}
			if len(batch) > 0 && size+p.size() > gc.cfg.MaxBatch {
				gc.carry = p
				return
			}
			batch = append(batch, p)
			size += p.size()
		}
		// full: the batch takes nothing more.
		full := func() bool { return gc.carry != nil || size >= gc.cfg.MaxBatch }
		// freed: when the previous entry was answered (this slot taken).
		freed := time.Now()
		if p := gc.carry; p != nil && !(expireNext && len(held) > 0) {
			gc.carry = nil
			take(p)
		} else if len(held) == 0 {
			select {
			case p := <-gc.propCh:
				take(p)
			case <-gc.closing:
				return
			}
		}
		// backToBack: the batch's first proposal came at once, as the
		// renewals of clients renewing in a loop do (a lone quiet client
		// or a trickle of renewals does not).
		backToBack := time.Since(freed) < cmp.Or(gc.cfg.renewLinger, renewLingerMax)
		open := true
		if !(expireNext && len(held) > 0) {
			open = gc.collect(take, full)
		}
		if len(batch) == 0 || (expireNext && len(held) > 0) {
			batch = append(batch[:0], held[0])
			held[0] = nil
			held = held[1:]
			expireNext = false
			open = false
		} else {
			expireNext = len(held) > 0
		}
		if open && len(held) == 0 && gc.lingers(batch, gc.busy(backToBack)) {
			// Only acquires that will queue, which wait for a later
			// grant anyway, and ticks of a busy log: in a hand-off the
			// holder's release then shares this entry. Another queuing
			// acquire or a tick does not end the wait (the release may
			// still be on its way).
			timer := time.NewTimer(cmp.Or(gc.cfg.lingerMax, lingerMax))
			gc.lingering.Store(true)
		linger:
			for {
				select {
				case p := <-gc.propCh:
					take(p)
					if !gc.collect(take, full) || len(held) > 0 || !gc.lingers(batch, gc.busy(backToBack)) {
						break linger
					}
				case <-timer.C:
					break linger
				case <-gc.closing:
					break linger
				}
			}
			gc.lingering.Store(false)
			timer.Stop()
			expireNext = len(held) > 0
		}
		if open && len(held) == 0 && backToBack {
			open = gc.awaitRenewals(take, &batch, &held, full)
			expireNext = len(held) > 0
		}
		gc.noteRenewals(batch)
		// Checked after the whole batch is taken, so no proposal of an
		// ended term can follow a new term's into the log.
		batch = gc.dropAbandoned(batch)
		select {
		case <-gc.closing:
			// A batch held for a companion (lingers, awaitRenewals) or
			// taken as the node closed never reaches Raft: answered as
			// the queued proposals are (drain), not applied.
			refuseUnsent(batch)
			refuseUnsent(held)
			return
		default:
		}
		if len(batch) == 0 {
			<-gc.inflight
			continue
		}
		var cmd fsm.Command = batch[0].cmd
		if len(batch) > 1 || cmd == nil {
			b := &fsm.Batch{Commands: make([]fsm.Command, 0, size)}
			for _, p := range batch {
				b.Commands = append(b.Commands, p.commands()...)
			}
			cmd = b
			if len(b.Commands) == 1 {
				cmd = b.Commands[0]
			}
		}
		data, err := gc.encode(cmd)
		if err != nil {
			for _, p := range batch {
				p.done <- propResult{err: &wire.Error{Code: wire.CodeInternal, Message: "encode command: " + err.Error()}}
			}
			<-gc.inflight
			continue
		}
		fut := gc.cl.Apply(data, gc.cfg.ApplyTimeout)
		go gc.await(fut, append([]*proposal(nil), batch...))
	}
}

// lingerMax bounds how long the batcher holds an entry of acquires that
// will queue, and ticks of a busy log (lingers), for a companion proposal,
// so that a hand-off's release shares the entry instead of waiting behind
// the next re-acquire or a tick.
const lingerMax = 5 * time.Millisecond

// tickLingerPeriod is the shortest tick period whose ticks linger: a tick
// is then late by at most a twentieth of a period, as one queued behind
// a slow append can be (fsm.GraceTicks covers a tick that commits late).
const tickLingerPeriod = 20 * lingerMax

// Renewals from clients that renew in a loop otherwise settle into two
// cohorts, one committing while the other queues: the batcher holds an
// entry of renewals a moment for the leases the previous entry renewed, so
// that one entry carries them all. The wait ends when they are all in, when
// none has come for renewGap, at renewLingerMax, or when anything but a
// renewal comes. Never held: a lone client, an entry whose first proposal
// came later than renewLingerMax after the previous answer, an entry with
// anything but renewals; and after a wait in which fewer than half of the
// awaited came, the next renewSkips entries.
const (
	renewGap       = 2 * time.Millisecond
	renewLingerMax = 4 * time.Millisecond
	renewSkips     = 16
)

// noteRenewals records the leases the renewals of batch (the next entry)
// renew: awaitRenewals waits for them in the entry after it.
func (gc *groupCommit) noteRenewals(batch []*proposal) {
	clear(gc.renewed)
	for _, p := range batch {
		for _, c := range p.commands() {
			if r, ok := c.(*fsm.Renew); ok {
				if gc.renewed == nil {
					gc.renewed = make(map[string]struct{}, len(batch))
				}
				gc.renewed[r.LeaseID] = struct{}{}
			}
		}
	}
}

// renewals deletes from gc.renewed the leases p renews, and reports
// whether p only renews.
func (gc *groupCommit) renewals(p *proposal) bool {
	for _, c := range p.commands() {
		r, ok := c.(*fsm.Renew)
		if !ok {
			return false
		}
		delete(gc.renewed, r.LeaseID)
	}
	return true
}

// awaitRenewals holds a batch of renewals while the others of the previous
// entry's leases arrive (see renewGap), and reports whether the batch is
// still open.
func (gc *groupCommit) awaitRenewals(take func(*proposal), batch *[]*proposal, held *[]*proposal, full func() bool) bool {
	if len(gc.renewed) < 2 {
		return true
	}
	for _, p := range *batch {
		if !gc.renewals(p) {
			return true
		}
	}
	if len(gc.renewed) == 0 {
		return true
	}
	if gc.renewSkip > 0 {
		gc.renewSkip--
		return true
	}
	awaited := len(gc.renewed)
	// missed: the wait ended without most of them.
	missed := func() bool {
		if 2*len(gc.renewed) > awaited {
			gc.renewSkip = renewSkips
		}
		return true
	}
	max, gap := renewLingerMax, renewGap
	if gc.cfg.renewLinger > 0 {
		max, gap = gc.cfg.renewLinger, gc.cfg.renewLinger
	}
	end := time.Now().Add(max)
	if gc.renewTimer == nil {
		gc.renewTimer = time.NewTimer(gap)
	} else {
		gc.renewTimer.Reset(gap)
	}
	defer gc.renewTimer.Stop()
	gc.lingering.Store(true)
	defer gc.lingering.Store(false)
	for {
		select {
		case p := <-gc.propCh:
			take(p)
			if !gc.renewals(p) || len(*held) > 0 || len(gc.renewed) == 0 || full() {
				return !full()
			}
			left := time.Until(end)
			if left <= 0 {
				return missed()
			}
			gc.renewTimer.Reset(min(gap, left))
		case <-gc.renewTimer.C:
			return missed()
		case <-gc.closing:
			return true
		}
	}
}

// collect adds what is waiting on propCh to the batch (through take),
// without blocking, up to MaxBatch commands (full), and reports whether the batch is
// still open (not full).
func (gc *groupCommit) collect(take func(*proposal), full func() bool) bool {
	for !full() {
		select {
		case p := <-gc.propCh:
			take(p)
		default:
			return true
		}
	}
	return false
}

// lingers reports whether batch may wait for a companion proposal: every
// proposal of it is an acquire that may wait on a key with no free slot
// (it will queue, not be granted: its caller waits for a later entry's
// grant anyway), or, when busy (the batch's first proposal came as the
// previous entry was answered: more is on its way), a tick (the clock,
// late by at most lingerMax) whose period is at least tickLingerPeriod.
// An acquire that its key's waiter limit (Quota.KeyWaiters) will refuse
// does not wait. Whether an acquire queues is still decided when the
// entry applies; waiting changes which entry carries it, never its answer.
func (gc *groupCommit) lingers(batch []*proposal, busy bool) bool {
	acquires := false
	for _, p := range batch {
		switch c := p.cmd.(type) {
		case *fsm.Tick:
			if !busy || time.Duration(c.PeriodMS)*time.Millisecond < tickLingerPeriod {
				return false
			}
		case *fsm.Acquire:
			if c.WaitTicks == 0 {
				return false
			}
			acquires = true
		default:
			return false
		}
	}
	if !acquires {
		return true
	}
	r := gc.rep
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, p := range batch {
		a, ok := p.cmd.(*fsm.Acquire)
		if !ok {
			continue
		}
		if !r.f.KeyFull(a.Key) || (a.Quota.KeyWaiters > 0 && uint64(r.f.KeyWaiters(a.Key)) >= a.Quota.KeyWaiters) {
			return false
		}
	}
	return true
}

// busy is lingers' busy: backToBack, or what a test says
// (Config.busyLog).
func (gc *groupCommit) busy(backToBack bool) bool {
	if gc.cfg.busyLog != nil {
		return gc.cfg.busyLog()
	}
	return backToBack
}

// refuseUnsent answers the proposals of a batch that never reached Raft,
// at shutdown: not applied, as drain answers those still queued.
func refuseUnsent(batch []*proposal) {
	for _, p := range batch {
		p.done <- propResult{err: errShuttingDown()}
	}
}

func isExpire(p *proposal) bool {
	_, ok := p.cmd.(*fsm.Expire)
	return ok
}

// dropAbandoned answers and removes the proposals whose ctx has ended; none
// was sent to Raft.
func (gc *groupCommit) dropAbandoned(batch []*proposal) []*proposal {
	kept := batch[:0]
	for _, p := range batch {
		if p.ctx != nil && p.ctx.Err() != nil {
			p.done <- propResult{err: &wire.Error{Code: wire.CodeNoLeader, Message: "the request was abandoned before it was proposed; it was not applied"}}
			continue
		}
		kept = append(kept, p)
	}
	clear(batch[len(kept):])
	return kept
}

func (gc *groupCommit) await(fut cluster.ApplyFuture, batch []*proposal) {
	err := fut.Error()
	<-gc.inflight
	if err != nil {
		e := raftError(err)
		for _, p := range batch {
			p.done <- propResult{err: e}
		}
		return
	}
	results, _ := fut.Response().([]fsm.Result)
	now := time.Now()
	i := 0
	for _, p := range batch {
		n := p.size()
		gc.stats.observeApply(now.Sub(p.start), n)
		if i+n > len(results) {
			p.done <- propResult{err: &wire.Error{Code: wire.CodeInternal, Message: "missing apply result"}}
			i += n
			continue
		}
		if p.unit != nil {
			p.done <- propResult{unit: results[i : i+n : i+n], index: fut.Index()}
		} else {
			p.done <- propResult{res: results[i], index: fut.Index()}
		}
		i += n
	}
}

// raftError is a failed Apply as an API error (cluster.ClassifyApply says
// which): NO_LEADER or UNAVAILABLE (503, with Retry-After: the same
// request may simply be sent again) when the entry was certainly never
// appended, INDETERMINATE when it may have been.
func raftError(err error) *wire.Error {
	e := cluster.ClassifyApply(err)
	switch e.Class {
	case cluster.NotLeader:
		return &wire.Error{Code: wire.CodeNoLeader, Message: e.Msg}
	case cluster.Busy:
		return &wire.Error{Code: wire.CodeUnavailable, Message: e.Msg}
	default:
		return &wire.Error{Code: wire.CodeIndeterminate, Message: e.Msg}
	}
}
