package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Nemesis steps the built-in scenarios share.

// wipeRestartOriginal kills and wipes node n, pauses every other node,
// restarts n with its original command, resumes the others after d, then
// waits until another node has seen n leave the voters (the leader removes
// the old member) and come back as a healthy voter, and n serves.
func (e *Env) wipeRestartOriginal(ctx context.Context, n int, d time.Duration) error {
	others := e.Others(n)
	// Pausing first: a tier that cannot pause is skipped before anything
	// is broken.
	if err := e.C.Pause(others[0]); err != nil {
		return err
	}
	paused := []int{others[0]}
	resume := func() error {
		var first error
		for _, o := range paused {
			if err := e.C.Resume(o); err != nil && first == nil {
				first = err
			}
		}
		paused = nil
		return first
	}
	defer resume()
	if err := e.C.Wipe(n); err != nil {
		return err
	}
	e.Count("wipes", 1)
	e.Note("wipe", fmt.Sprintf("node %d killed, data wiped", n), nil)
	for _, o := range others[1:] {
		if err := e.C.Pause(o); err != nil {
			return err
		}
		paused = append(paused, o)
	}
	err := e.Fault(ctx, "pause", fmt.Sprintf("nodes %v while node %d restarts wiped", others, n), d, func() error {
		if err := e.C.Restart(n); err != nil {
			return err
		}
		e.Count("restarts", 1)
		return nil
	}, resume)
	if err != nil {
		return err
	}
	return e.waitRejoinedVoter(ctx, n, others)
}

// waitRejoinedVoter waits (up to 60 s) until one of others has seen node n
// leave the voters and come back as a healthy voter, and n serves its own
// state.
func (e *Env) waitRejoinedVoter(ctx context.Context, n int, others []int) error {
	id := e.C.NodeID(n)
	deadline := time.Now().Add(60 * time.Second)
	last := "no answer"
	replaced := false
	for {
		for _, o := range others {
			st, err := e.Admin(o).Cluster(ctx)
			if err != nil {
				last = err.Error()
				continue
			}
			for _, m := range st.Members {
				if m.ID != id {
					continue
				}
				last = fmt.Sprintf("node %d sees %s as voter=%v health=%s", o, id, m.Voter, m.Health)
				if !m.Voter {
					replaced = true // removed, or added back as a non-voter
				}
				if !replaced || !m.Voter || m.Health != "healthy" {
					continue
				}
				// Back as a voter after the replacement, and serving its own
				// state.
				if ls, err := e.Local(ctx, n, 0, time.Second); err != nil || ls.AppliedIndex == 0 {
					last = fmt.Sprintf("%s is a voter but its local state: %v", id, err)
					continue
				}
				e.Count("wiped-rejoined", 1)
				e.Note("rejoined", last, nil)
				return nil
			}
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("node %d did not rejoin as a voter within 60 s: %s", n, last)
			e.Note("rejoined", id, err)
			return err
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// killRestart kills the nodes, waits d and restarts them.
func (e *Env) killRestart(ctx context.Context, nodes []int, d time.Duration) error {
	fault := e.Fault
	if 2*len(nodes) >= e.C.Size() {
		fault = e.FaultNoQuorum // no healthy majority left: liveness excuses the window
	}
	return fault(ctx, "kill", fmt.Sprintf("nodes %v", nodes), d, func() error {
		for _, n := range nodes {
			if err := e.C.Kill(n); err != nil {
				return err
			}
		}
		return nil
	}, func() error {
		for _, n := range nodes {
			if err := e.C.Restart(n); err != nil {
				return err
			}
			e.Count("restarts", 1)
		}
		return nil
	})
}

// powerCutter is a Cluster that can cut a node's power (NetnsCluster with
// NetnsOptions.LazyDisk).
type powerCutter interface {
	PowerCut(i int) (int64, error)
}

// powerCutRestart cuts the nodes' power at once (each killed, its unsynced
// writes lost), waits d and restarts them.
func (e *Env) powerCutRestart(ctx context.Context, nodes []int, d time.Duration) error {
	pc, ok := e.C.(powerCutter)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot cut a node's power: %w", e.Tier, ErrUnsupported)
	}
	return e.Fault(ctx, "power-cut", fmt.Sprintf("nodes %v", nodes), d, func() error {
		for _, n := range nodes {
			lost, err := pc.PowerCut(n)
			if err != nil {
				return err
			}
			e.Count("power-cuts", 1)
			e.Note("power-cut", fmt.Sprintf("node %d: %d unsynced bytes lost", n, lost), nil)
		}
		return nil
	}, func() error {
		for _, n := range nodes {
			if err := e.C.Restart(n); err != nil {
				return err
			}
			e.Count("restarts", 1)
		}
		return nil
	})
}

// removeAndRejoin removes node n through the leader (partitioning it off
// first if asked), then wipes it and brings it back as a new server.
func (e *Env) removeAndRejoin(ctx context.Context, n int, partition bool) error {
	if partition {
		if err := e.C.Partition([][]int{{n}, e.Others(n)}); err != nil {
			return err
		}
		e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "start", Detail: fmt.Sprintf("node %d alone", n)})
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	if err := e.remove(ctx, n); err != nil {
		return err
	}
	if partition {
		if err := e.C.Heal(); err != nil {
			return err
		}
		e.H.Note(Event{Type: "nemesis", Name: "partition", Phase: "stop", Detail: fmt.Sprintf("node %d alone", n)})
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	if err := e.C.Wipe(n); err != nil {
		return err
	}
	e.Count("wipes", 1)
	return e.rejoinWiped(ctx, n, false)
}

// remove asks the current leader (other than n) to remove node n, retrying
// through leader changes.
func (e *Env) remove(ctx context.Context, n int) error {
	id := e.C.NodeID(n)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if l := e.Leader(ctx); l >= 0 {
			err = e.Admin(l).RemoveMember(ctx, id)
			if err == nil {
				e.Count("removals", 1)
				e.Note("remove", fmt.Sprintf("node %d (%s) via node %d", n, id, l), nil)
				return nil
			}
		}
		if time.Now().After(deadline) {
			e.Note("remove", fmt.Sprintf("node %d (%s)", n, id), err)
			return fmt.Errorf("remove node %d: %v", n, err)
		}
		if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
			return err
		}
	}
}

// rejoinWiped removes the wiped node's old membership if asked (the
// product refuses a wiped server under a current member's id) and restarts
// it empty; it joins as a new server.
func (e *Env) rejoinWiped(ctx context.Context, n int, remove bool) error {
	if remove {
		if err := e.remove(ctx, n); err != nil {
			return err
		}
	}
	if err := e.C.Restart(n); err != nil {
		return err
	}
	e.Count("restarts", 1)
	e.Note("restart", fmt.Sprintf("node %d empty", n), nil)
	return nil
}

// clockJumpSeen proves a wall-clock jump reached the server: a lease
// granted through node l (the leader stamps acquired_at from its wall
// clock) shows an acquired_at within a minute of the harness's time plus
// d; it counts "clock-jump-seen". Without it, a jump that never landed
// (a binary without the chaos clock, a fault file not read) would pass.
func (e *Env) clockJumpSeen(ctx context.Context, l int, d time.Duration) {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lease, err := e.Admin(l).Acquire(actx, wire.AcquireRequest{Key: fmt.Sprintf("chaos-clock-jump/%d", e.H.Now()), Holder: "clock-jump", TTLMS: 1000})
	if err != nil {
		e.Note("clock", "probe grant through the jumped leader failed", err)
		return
	}
	_, _ = e.Admin(l).Release(actx, wire.ReleaseRequest{LeaseID: lease.LeaseID, Token: lease.Token})
	off := lease.AcquiredAt.Sub(time.Now())
	if off > d-time.Minute && off < d+time.Minute {
		e.Count("clock-jump-seen", 1)
	}
	e.Note("clock", fmt.Sprintf("a grant through node %d shows acquired_at %v off the harness's clock", l, off.Round(time.Second)), nil)
}
