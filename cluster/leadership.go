package cluster

import (
	"context"
	"errors"
	"sort"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// This file keeps a leader honest: a term that commits nothing of its own
// for too long hands leadership on (the watchdog), by a transfer or, when
// Raft's leader loop is itself stuck, by a TimeoutNow sent straight through
// the transport; a graceful stop hands leadership on first.

// Progress is when a leadership term last committed an entry of its own
// (or began), on the monotonic clock.
type Progress struct {
	base time.Time
	last atomic.Int64 // since base
}

// NewProgress starts a term's progress now.
func NewProgress() *Progress { return &Progress{base: time.Now()} }

// Mark records progress now.
func (p *Progress) Mark() { p.last.Store(int64(time.Since(p.base))) }

// Since is how long ago progress was last marked.
func (p *Progress) Since() time.Duration {
	return time.Since(p.base) - time.Duration(p.last.Load())
}

// Watchdog says when a leader that commits nothing must give up leadership.
type Watchdog struct {
	// Stall is how long a term may go without progress.
	Stall time.Duration
	// Exempt, if set, reports a term that commits nothing by design (a
	// server refused by the cluster): handing it on would change nothing.
	Exempt func() bool
	// Busy, if set, reports work that commits slowly but is progress (a
	// long operation whose entries commit, or one being applied).
	Busy func(bound time.Duration) bool
}

// RunWatchdog gives up leadership whenever the term of ctx has made no
// progress for w.Stall while this server still leads, and again after every
// further w.Stall without progress. It returns when ctx ends or the cluster
// closes.
func (c *Cluster) RunWatchdog(ctx context.Context, p *Progress, w Watchdog) {
	t := time.NewTicker(min(w.Stall/8, 250*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.stop:
			return
		case <-t.C:
		}
		since := p.Since()
		if since < w.Stall || !c.IsLeader() || w.Exempt != nil && w.Exempt() {
			continue
		}
		if w.Busy != nil && w.Busy(w.Stall) {
			p.Mark()
			continue
		}
		c.logger.Warn("this leader has committed nothing for too long; giving up leadership",
			"for", since.Round(time.Millisecond), "bound", w.Stall)
		c.watchdogStepDowns.Add(1)
		c.StepDown(ctx)
		p.Mark()
	}
}

// WatchdogStepDowns is how many times the watchdog gave leadership up.
func (c *Cluster) WatchdogStepDowns() int64 { return c.watchdogStepDowns.Load() }

// transferWait bounds how long a leadership transfer may take before
// StepDown forces an election instead.
func (c *Cluster) transferWait() time.Duration {
	return max(time.Second, 2*c.cfg.HeartbeatTimeout)
}

// StepDown hands leadership on: a Raft leadership transfer, and if that
// does not happen in time (Raft's leader loop is itself stuck, e.g. in a
// log write on a stalled disk, so it cannot even start one), a TimeoutNow
// sent straight through the transport to the most up-to-date voter, which
// starts an election at once. Either is safe at any time: an election
// never loses a committed entry.
func (c *Cluster) StepDown(ctx context.Context) {
	fut := c.raft.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	timer := time.NewTimer(c.transferWait())
	defer timer.Stop()
	select {
	case err := <-done:
		if err == nil {
			c.logger.Info("leadership transferred")
			return
		}
		c.logger.Warn("leadership transfer failed; forcing an election", "err", err)
	case <-timer.C:
		c.logger.Warn("leadership transfer did not complete in time; forcing an election")
	case <-ctx.Done():
		return
	}
	if ctx.Err() != nil || !c.IsLeader() {
		return
	}
	for _, s := range c.electionTargets() {
		err := c.timeoutNow(s)
		if err == nil {
			c.logger.Warn("forced an election: sent TimeoutNow", "to", s.ID)
			return
		}
		c.logger.Warn("TimeoutNow failed", "to", s.ID, "err", err)
		if ctx.Err() != nil {
			return
		}
	}
}

// electionTargets are the other voters, the most up-to-date healthy ones
// first (as autopilot last saw them).
func (c *Cluster) electionTargets() []raft.Server {
	conf, err := c.raftConfiguration()
	if err != nil {
		return nil
	}
	var out []raft.Server
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != c.cfg.NodeID {
			out = append(out, s)
		}
	}
	type rank struct {
		healthy bool
		index   uint64
	}
	ranks := map[raft.ServerID]rank{}
	if st := c.apState.Load(); st != nil {
		for id, srv := range st.Servers {
			ranks[id] = rank{srv.Health.Healthy, srv.Stats.LastIndex}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := ranks[out[i].ID], ranks[out[j].ID]
		if a.healthy != b.healthy {
			return a.healthy
		}
		return a.index > b.index
	})
	return out
}

// timeoutNow tells s to start an election now, as the last step of a
// leadership transfer does, bounded by transferWait.
func (c *Cluster) timeoutNow(s raft.Server) error {
	req := &raft.TimeoutNowRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(c.cfg.NodeID),
			Addr: c.trans.EncodePeer(raft.ServerID(c.cfg.NodeID), raft.ServerAddress(c.Addr))},
	}
	done := make(chan error, 1)
	go func() { done <- c.trans.TimeoutNow(s.ID, s.Address, req, &raft.TimeoutNowResponse{}) }()
	select {
	case err := <-done:
		return err
	case <-time.After(c.transferWait()):
		return errors.New("no answer in time")
	}
}

// BarrierCtx applies a Raft barrier, waiting no longer than ctx lives (a
// stalled disk holds it indefinitely).
func (c *Cluster) BarrierCtx(ctx context.Context, timeout time.Duration) error {
	fut := c.raft.Barrier(timeout)
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CloseTransferWait bounds the leadership hand-off of a graceful stop.
var CloseTransferWait = 5 * time.Second

// HandOff hands leadership on before a leader stops, when another voter
// can take it, so the followers need not wait an election timeout after it
// went. A failed or slow hand-off leaves the stop to go on as before.
func (c *Cluster) HandOff() {
	if c == nil || !c.IsLeader() {
		return
	}
	conf, err := c.Configuration()
	if err != nil {
		return
	}
	others := false
	for _, s := range conf.Servers {
		others = others || s.Voter && s.ID != c.cfg.NodeID
	}
	if !others {
		return
	}
	done := make(chan error, 1)
	go func() { done <- c.TransferLeadership() }()
	t := time.NewTimer(CloseTransferWait)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			c.logger.Warn("leadership hand-off before stopping failed", "err", err)
		} else {
			c.logger.Info("leadership handed on before stopping")
		}
	case <-t.C:
		c.logger.Warn("leadership hand-off before stopping did not complete in time")
	}
}

// recordingPilot passes autopilot's state on to the application and keeps
// it for electionTargets.
type recordingPilot struct {
	autopilot.ApplicationIntegration
	c *Cluster
}

func (p recordingPilot) NotifyState(s *autopilot.State) {
	p.c.apState.Store(s)
	p.ApplicationIntegration.NotifyState(s)
}
