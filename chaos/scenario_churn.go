package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Scenarios of faults composed with membership churn, of a paused majority
// and of interrupted snapshot installs. Each runs the configuration checker
// (CheckConfiguration) besides the others.

func init() { builtin = append(builtin, churnScenarios...) }

var churnScenarios = []*Scenario{
	{Name: "pause-majority", Class: "pause", Nodes: 3, Liveness: true, Configuration: true,
		Doc: "SIGSTOP two of three servers for 5 s, then SIGCONT: first the leader and a follower, then both followers; " +
			"nothing commits while they are stopped, and once they run again the clock must move within the liveness bound",
		Expect: map[string]int{"majority-pauses": 2, "stalled-while-paused": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			for round := 0; round < 2; round++ {
				l, err := e.WaitLeader(ctx, 15*time.Second)
				if err != nil {
					return err
				}
				fs := e.Others(l)
				paused := []int{l, fs[e.Rng.IntN(len(fs))]} // the leader and a follower
				if round == 1 {
					paused = fs // both followers: the leader stays, alone
				}
				if err := e.pauseMajority(ctx, paused, 5*time.Second); err != nil {
					return err
				}
				if err := sleepCtx(ctx, 3*time.Second); err != nil {
					return err
				}
			}
			return nil
		}},
	{Name: "churn-remove-partition", Class: "membership", Liveness: true, StallBound: wideStall, Configuration: true,
		Doc: "a follower is removed while the leader that takes the removal is cut off (the removal is retried through the next leader); " +
			"healed, the removed server is wiped and rejoins as a new server while another follower is killed and restarted: " +
			"it must be a healthy voter again, one voter change at a time, one leader per term",
		Expect: map[string]int{"removals": 1, "leader-changes": 1, "wiped-rejoined": 1, "voter-changes": 2, "restarts": 2},
		Nemesis: func(ctx context.Context, e *Env) error {
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			perm := e.Rng.Perm(len(fs))
			f, k := fs[perm[0]], fs[perm[1]]
			if canaryRecoverAlone {
				return e.recoverAlone(ctx, neverAlone(e.C, fs))
			}
			removed := make(chan error, 1)
			go func() { removed <- e.remove(ctx, f) }()
			// The removal reaches the leader; it is cut off right behind it.
			if err := sleepCtx(ctx, time.Duration(e.Rng.IntN(50))*time.Millisecond); err != nil {
				return err
			}
			ferr := e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone while it removes node %d", l, f), faultFor,
				func() error { return e.C.Partition([][]int{{l}, e.Others(l)}) }, e.C.Heal)
			if err := <-removed; err != nil || ferr != nil {
				return fmt.Errorf("remove node %d across a partition: %v; fault: %v", f, err, ferr)
			}
			if err := sleepCtx(ctx, 2*time.Second); err != nil {
				return err
			}
			if err := e.C.Wipe(f); err != nil {
				return err
			}
			e.Count("wipes", 1)
			if err := e.rejoinWiped(ctx, f, false); err != nil {
				return err
			}
			// While the new server is added and promoted, another follower
			// goes down and comes back.
			joined := make(chan error, 1)
			go func() { joined <- e.waitRejoinedVoter(ctx, f, e.Others(f, k)) }()
			kerr := e.killRestart(ctx, []int{k}, faultFor/2)
			if err := <-joined; err != nil || kerr != nil {
				return fmt.Errorf("rejoin of node %d while node %d was killed: %v; kill: %v", f, k, err, kerr)
			}
			return sleepCtx(ctx, faultFor/2)
		}},
	{Name: "churn-renumber-kill", Class: "renumber", Liveness: true, StallBound: wideStall, Configuration: true,
		Doc: "a follower restarts at a new address (its namespace renumbered: same data directory and id) while the leader is killed: " +
			"the next leader must update the member's address, and it must be a healthy voter there within 60 s; real processes only",
		Expect: map[string]int{"renumbers": 1, "renumbered-rejoined": 1, "leader-changes": 1, "restarts": 1},
		Nemesis: func(ctx context.Context, e *Env) error {
			r, ok := e.C.(renumberer)
			if !ok {
				return fmt.Errorf("chaos: the %s tier cannot renumber a node: %w", e.Tier, ErrUnsupported)
			}
			l, err := e.WaitLeader(ctx, 10*time.Second)
			if err != nil {
				return err
			}
			fs := e.Others(l)
			f := fs[e.Rng.IntN(len(fs))]
			type moved struct {
				addr string
				err  error
			}
			done := make(chan moved, 1)
			kerr := e.Fault(ctx, "kill", fmt.Sprintf("leader %d, while node %d moves", l, f), faultFor/2, func() error {
				if err := e.C.Kill(l); err != nil {
					return err
				}
				go func() {
					addr, err := r.Renumber(f)
					e.Note("renumber", fmt.Sprintf("node %d restarted with raft %s", f, addr), err)
					done <- moved{addr, err}
				}()
				return nil
			}, func() error {
				if err := e.C.Restart(l); err != nil {
					return err
				}
				e.Count("restarts", 1)
				return nil
			})
			m := <-done
			if m.err != nil || kerr != nil {
				return fmt.Errorf("renumber node %d: %v; kill of the leader: %v", f, m.err, kerr)
			}
			e.Count("renumbers", 1)
			if err := e.waitVoterAt(ctx, f, m.addr, 60*time.Second); err != nil {
				return err
			}
			e.Count("renumbered-rejoined", 1)
			return sleepCtx(ctx, faultFor/2)
		}},
	{Name: "churn-newid-clock", Class: "membership", Liveness: true, StallBound: wideStall, Configuration: true, Eps: 0.05,
		Doc: "a follower is replaced by a server under a new id at its address while the leader's wall clock is 5 min ahead and its monotonic clock runs at half speed: " +
			"killed and wiped, its old id removed through the API, the new server started empty must be added and promoted, one voter change at a time; real processes only",
		Expect:  map[string]int{"new-id-voter": 1, "old-id-removed": 1, "voter-changes": 2, "clock-jump-seen": 1},
		Nemesis: func(ctx context.Context, e *Env) error { return e.newIDUnderClockFault(ctx) }},
}

// pauseMajority SIGSTOPs the nodes (a majority) for d, then SIGCONTs them.
// The node left running must commit nothing meanwhile: its commit index,
// read a second into the pause (what was in flight has landed) and at its
// end, must be the same ("stalled-while-paused"); a pause that did not
// stop the majority leaves it moving, and the run fails as ineffective.
func (e *Env) pauseMajority(ctx context.Context, nodes []int, d time.Duration) error {
	u := e.Others(nodes...)[0]
	firstCh := make(chan *LocalState, 1)
	return e.FaultNoQuorum(ctx, "pause", fmt.Sprintf("nodes %v (a majority); node %d runs", nodes, u), d, func() error {
		for _, n := range nodes {
			if err := e.C.Pause(n); err != nil {
				return err
			}
		}
		e.Count("majority-pauses", 1)
		go func() {
			var ls *LocalState
			if sleepCtx(ctx, time.Second) == nil {
				ls, _ = e.Local(ctx, u, 0, time.Second)
			}
			firstCh <- ls
		}()
		return nil
	}, func() error {
		first := <-firstCh
		last, err := e.Local(ctx, u, 0, time.Second)
		if err == nil && first != nil {
			if last.CommitIndex == first.CommitIndex {
				e.Count("stalled-while-paused", 1)
			}
			e.Note("paused-commit", fmt.Sprintf("node %d's commit index: %d a second into the pause, %d at its end",
				u, first.CommitIndex, last.CommitIndex), nil)
		}
		var errs []error
		for _, n := range nodes {
			errs = append(errs, e.C.Resume(n))
		}
		return errors.Join(errs...)
	})
}

// waitVoterAt waits up to d until another node lists node n as a healthy
// voter (at Raft address addr, if not empty) and n serves its own state.
func (e *Env) waitVoterAt(ctx context.Context, n int, addr string, d time.Duration) error {
	id := e.C.NodeID(n)
	start := time.Now()
	last := "no answer"
	for {
		for _, o := range e.Others(n) {
			if !e.C.Alive(o) {
				continue
			}
			st, err := e.Admin(o).Cluster(ctx)
			if err != nil {
				last = err.Error()
				continue
			}
			for _, m := range st.Members {
				if m.ID != id {
					continue
				}
				last = fmt.Sprintf("node %d sees %s as voter=%v health=%s raft=%s", o, id, m.Voter, m.Health, m.RaftAddr)
				if !m.Voter || m.Health != "healthy" || (addr != "" && m.RaftAddr != addr) {
					continue
				}
				if ls, err := e.Local(ctx, n, 0, time.Second); err != nil || ls.AppliedIndex == 0 {
					last = fmt.Sprintf("%s is a voter at %s but its local state: %v", id, m.RaftAddr, err)
					continue
				}
				e.Note("voter", fmt.Sprintf("%s after %v", last, time.Since(start).Round(time.Millisecond)), nil)
				return nil
			}
		}
		if time.Since(start) > d {
			err := fmt.Errorf("node %d not a healthy voter (at %q) within %v: %s", n, addr, d, last)
			e.Note("voter", id, err)
			return err
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// aloneRecoverer is a Cluster that can rewrite a stopped node's
// configuration to itself alone (NetnsCluster).
type aloneRecoverer interface {
	RecoverAlone(i int) (string, error)
}

// recoverAlone is the canary_config_recover harness fault: node n is
// stopped, made the one voter of its cluster by `leasehold data recover`
// while the others run on, and restarted; the run goes on long enough for
// the configuration checker to sample its configuration.
func (e *Env) recoverAlone(ctx context.Context, n int) error {
	r, ok := e.C.(aloneRecoverer)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot rewrite a node's configuration: %w", e.Tier, ErrUnsupported)
	}
	out, err := r.RecoverAlone(n)
	e.Note("recover-alone", fmt.Sprintf("node %d made the one voter of its cluster (a harness fault): %s", n, out), err)
	if err != nil {
		return err
	}
	if err := e.C.Restart(n); err != nil {
		return err
	}
	e.Count("restarts", 1)
	return sleepCtx(ctx, 2*faultFor)
}

// reidentifier is a Cluster that can bring a node back empty under a new
// id (NetnsCluster).
type reidentifier interface {
	Reidentify(i int) (string, error)
}

// newIDUnderClockFault replaces a follower by a server under a new id at
// its address while the leader's clocks are off (its wall clock 5 min
// ahead, proved by a grant it stamps, and its monotonic clock at half
// speed): the follower is killed and wiped, its old id removed through the
// API, and the new server started empty must be added and promoted, one
// voter change at a time.
func (e *Env) newIDUnderClockFault(ctx context.Context) error {
	r, ok := e.C.(reidentifier)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot bring a node back under a new id: %w", e.Tier, ErrUnsupported)
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	fs := e.Others(l)
	f := fs[e.Rng.IntN(len(fs))]
	old := e.C.NodeID(f)
	if err := e.C.ClockJump(l, 5*time.Minute); err != nil {
		return err
	}
	if err := e.C.ClockRate(l, 0.5); err != nil {
		return err
	}
	e.H.Note(Event{Type: "nemesis", Name: "clock", Phase: "start", Detail: fmt.Sprintf("leader %d: wall clock +5 min, monotonic clock at 0.5x", l)})
	// The server reads its fault file about every 20 ms.
	if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	e.clockJumpSeen(ctx, l, 5*time.Minute)
	// As docs/operations.md replaces a failed server: the old id removed,
	// then the replacement started empty (under a new id at the old
	// address, raft refuses it while the old member holds the address).
	err = e.C.Wipe(f)
	e.Note("wipe", fmt.Sprintf("node %d (%s) killed, data wiped", f, old), err)
	if err == nil {
		err = e.removeID(ctx, old, f)
	}
	var id string
	if err == nil {
		id, err = r.Reidentify(f)
		e.Note("reidentify", fmt.Sprintf("node %d (%s) back empty as %s", f, old, id), err)
	}
	if err == nil {
		e.Count("new-ids", 1)
		if err = e.waitVoterAt(ctx, f, "", 60*time.Second); err == nil {
			e.Count("new-id-voter", 1)
		}
	}
	uerr := errors.Join(e.C.ClockRate(l, 1), e.C.ClockJump(l, 0))
	e.H.Note(Event{Type: "nemesis", Name: "clock", Phase: "stop", Detail: fmt.Sprintf("leader %d", l)})
	if err != nil || uerr != nil {
		return errors.Join(err, uerr)
	}
	return sleepCtx(ctx, faultFor/2)
}

// removeID removes the server id (no longer any node's) through the
// leader, retrying through leader changes, and waits until a node other
// than skip no longer lists it as a voter.
func (e *Env) removeID(ctx context.Context, id string, skip int) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		if l := e.Leader(ctx); l >= 0 {
			last = e.Admin(l).RemoveMember(ctx, id)
			if last == nil {
				e.Count("removals", 1)
				e.Note("remove", fmt.Sprintf("old id %s via node %d", id, l), nil)
				break
			}
		}
		if time.Now().After(deadline) {
			e.Note("remove", id, last)
			return fmt.Errorf("remove %s: %v", id, last)
		}
		if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
			return err
		}
	}
	for {
		for _, o := range e.Others(skip) {
			st, err := e.Admin(o).Cluster(ctx)
			if err != nil {
				continue
			}
			listed := false
			for _, m := range st.Members {
				listed = listed || (m.ID == id && m.Voter)
			}
			if !listed {
				e.Count("old-id-removed", 1)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still a voter 30 s after its removal", id)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// neverAlone picks, of the nodes, one that no leader ever appended a
// configuration with as the one voter (the server that formed the
// cluster was: a rewrite to it alone is a configuration the cluster once
// had, which the configuration checker accepts as a jump).
func neverAlone(c Cluster, nodes []int) int {
	alone := map[string]bool{}
	for _, l := range readLogs(c) {
		for _, line := range strings.Split(l, "\n") {
			if updatingConfRe.MatchString(line) {
				alone[lineVoters(line)] = true
			}
		}
	}
	for _, n := range nodes {
		if !alone[c.NodeID(n)] {
			return n
		}
	}
	return nodes[0]
}
