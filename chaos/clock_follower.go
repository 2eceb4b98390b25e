package chaos

import (
	"context"
	"fmt"
	"time"
)

// clockFollowerLeads: a follower's clock goes wrong while it follows, and
// then it leads. Its wall clock jumps +5 min and its monotonic clock runs
// at 1.04x (within the 5% the holders allow); leadership is handed to it;
// while it leads, a grant it stamps must show the jump (the fault reached
// the leader's clock), and expiry, driven by the ticks the leader issues,
// must keep every checker green: a lease's remaining time survives the
// hand-over. Then its clock jumps back -10 min and slows to 0.5x while it
// still leads, and leadership moves on to a server whose clock is sound.
func (e *Env) clockFollowerLeads(ctx context.Context) error {
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	if err := e.C.ClockJump(f, 0); err != nil {
		return err // a binary without the chaos clock: skipped
	}
	var off time.Duration // f's wall-clock offset (ClockJump adds to it)
	restore := func() error {
		if err := e.C.ClockRate(f, 1); err != nil {
			return err
		}
		return e.C.ClockJump(f, -off)
	}
	return e.Fault(ctx, "clock", fmt.Sprintf("follower %d: wall +5m, monotonic 1.04x; then it leads", f), faultFor, func() error {
		if err := e.C.ClockJump(f, 5*time.Minute); err != nil {
			return err
		}
		off += 5 * time.Minute
		e.Count("clock-jumps", 1)
		if err := e.C.ClockRate(f, 1.04); err != nil {
			return err
		}
		// Let it follow on the wrong clock for a while, then lead.
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
		if err := e.transferTo(ctx, f); err != nil {
			return err
		}
		e.Count("faulty-clock-led", 1)
		e.clockJumpSeen(ctx, f, 5*time.Minute)
		return nil
	}, func() error {
		// Still leading: its wall clock jumps back past where it was and
		// its clock slows, then leadership moves on.
		if e.Leader(ctx) == f {
			if err := e.C.ClockJump(f, -10*time.Minute); err != nil {
				return err
			}
			off -= 10 * time.Minute
			e.Count("clock-jumps", 1)
			if err := e.C.ClockRate(f, 0.5); err != nil {
				return err
			}
			if err := sleepCtx(ctx, 3*time.Second); err != nil {
				return err
			}
			if err := e.transferTo(ctx, e.Others(f)[e.Rng.IntN(e.C.Size()-1)]); err != nil {
				e.Note("transfer", "away from the faulty clock", err)
			}
		}
		return restore()
	})
}

// transferTo hands leadership to node n (retrying for up to 15 s) and
// waits until n leads.
func (e *Env) transferTo(ctx context.Context, n int) error {
	id := e.C.NodeID(n)
	deadline := time.Now().Add(15 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		l := e.Leader(ctx)
		if l == n {
			e.Count("transfers", 1)
			e.Note("transfer", fmt.Sprintf("node %d leads", n), nil)
			return nil
		}
		if l >= 0 {
			if err := e.Admin(l).TransferLeadership(ctx, id); err != nil {
				last = err
			}
		}
		if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("leadership did not move to node %d within 15 s: %v", n, last)
}
