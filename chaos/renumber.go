package chaos

import (
	"context"
	"fmt"
	"time"
)

// renumberer is a Cluster whose nodes can move to another address
// (NetnsCluster: a namespace renumbered).
type renumberer interface {
	// Renumber kills node i and starts it again, same data directory and
	// id, with its Raft and gossip on a new IP; its API stays where the
	// harness reaches it. It returns the new Raft address.
	Renumber(i int) (string, error)
}

// renumberRejoin renumbers follower n and waits (up to 60 s) until the
// leader lists it as a healthy voter at its new Raft address, serving its
// own state; more than two elections meanwhile (an election storm) fail
// the scenario. ErrUnsupported where the tier cannot renumber.
func (e *Env) renumberRejoin(ctx context.Context, n, leader int) error {
	r, ok := e.C.(renumberer)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot renumber a node: %w", e.Tier, ErrUnsupported)
	}
	before, err := e.Admin(leader).Cluster(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	addr, err := r.Renumber(n)
	e.Note("renumber", fmt.Sprintf("node %d restarted with raft %s", n, addr), err)
	if err != nil {
		return err
	}
	e.Count("renumbers", 1)
	id := e.C.NodeID(n)
	deadline := start.Add(60 * time.Second)
	last := "no answer"
	for {
		for _, o := range e.Others(n) {
			st, err := e.Admin(o).Cluster(ctx)
			if err != nil {
				last = err.Error()
				continue
			}
			if st.Term > before.Term+2 {
				err := fmt.Errorf("an election storm while node %d moved: term %d, was %d", n, st.Term, before.Term)
				e.Note("renumber-rejoined", id, err)
				return err
			}
			for _, m := range st.Members {
				if m.ID != id {
					continue
				}
				last = fmt.Sprintf("node %d sees %s as voter=%v health=%s raft=%s", o, id, m.Voter, m.Health, m.RaftAddr)
				if !m.Voter || m.Health != "healthy" || m.RaftAddr != addr {
					continue
				}
				if ls, err := e.Local(ctx, n, 0, time.Second); err != nil || ls.AppliedIndex == 0 {
					last = fmt.Sprintf("%s is a voter at %s but its local state: %v", id, addr, err)
					continue
				}
				e.Count("renumbered-rejoined", 1)
				e.Note("renumber-rejoined", fmt.Sprintf("%s after %v; term %d, was %d", last,
					time.Since(start).Round(time.Millisecond), st.Term, before.Term), nil)
				return nil
			}
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("node %d did not rejoin at %s within 60 s: %s", n, addr, last)
			e.Note("renumber-rejoined", id, err)
			return err
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}
