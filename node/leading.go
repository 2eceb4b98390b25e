package node

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// leaderTerm is what this server does while it leads: establish the term
// (a barrier, its registry record), then run the clock, the reconciler and
// the state check until the term ends; and whether it is ready to serve in
// the term it leads (isReady).
type leaderTerm struct {
	ready atomic.Pointer[leadership] // set once a term's barrier applied

	cfg *Config
	log *slog.Logger
	rep *replica
	cl  *cluster.Cluster // set once Raft runs
	mem *cluster.Members
	// refused says why the cluster refuses this server (removed, of
	// another cluster, another sealing key); nil while it does not.
	refused func() error
	// A term runs the batcher's format check, the restore's progress
	// (the watchdog's), the reconciler, the state check and the clock.
	gc *groupCommit
	bk *backups
	rc *reconciler
	sc *stateCheck
	tk *ticker
	// propose commits this server's registry record.
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
}

// leadership is a leadership term in which this server became ready to
// serve: its barrier (so every entry of earlier terms) applied.
type leadership struct {
	ctx  context.Context // the term's, cancelled when leadership is lost
	term uint64          // the Raft term the barrier committed in
	// canaryStuck: canary_writes_stuck's leader refuses acquires.
	canaryStuck bool
}

// isReady reports whether this server leads in the very term in
// which its readiness was established. The term's context alone is not
// enough: it is cancelled asynchronously, so a server that lost leadership
// and won it again in a later term could still see it live before that
// term's barrier applied, with a commit index that does not yet cover what
// another leader committed in between. State is read before the term: the
// term cannot go back, so Leader then the recorded term means leader in
// that term, and a server never leads twice in one term.
func (lt *leaderTerm) isReady() bool { return lt.readyTerm() != nil }

// readyTerm is the leadership term this server is ready to serve in, nil
// when it is not (see isReady).
func (lt *leaderTerm) readyTerm() *leadership {
	p := lt.ready.Load()
	if p == nil || p.ctx.Err() != nil || !lt.cl.LeadsIn(p.term) {
		return nil
	}
	return p
}

// run runs for one leadership term: apply a barrier so that state reflects
// everything earlier leaders committed, record this server, then tick until
// leadership ends. A leader must either run the clock or give leadership
// up: a failed barrier or registry write is retried, and a watchdog hands
// leadership on when this term has committed nothing of its own (setup or
// ticks) for leaderStall (a stalled disk holds Raft's leader loop, and with
// it every commit, while heartbeats still keep the followers loyal).
func (lt *leaderTerm) run(ctx context.Context) {
	if err := lt.sc.outOfService(); err != nil {
		// A server whose state differs from the cluster's (or whose log
		// is damaged) must not lead: what it would grant and read comes
		// from that state.
		lt.log.Error("refusing to lead: " + err.Error())
		lt.sc.stepDownWhileLeading(ctx)
		return
	}
	defer lt.gc.crcOK.Store(false) // learnt again by the next term
	lt.gc.updateEntryCRCNow()
	progress := cluster.NewProgress()
	go lt.cl.RunWatchdog(ctx, progress, cluster.Watchdog{Stall: lt.cfg.leaderStall(),
		// A refused server (removed, or of another cluster) commits
		// nothing by design: handing its leadership on changes nothing.
		Exempt: func() bool { return lt.refused() != nil },
		// A restore's chunks commit, or its commit is being applied (ticks
		// wait behind it): the term is making progress.
		Busy: lt.bk.restoreBusy})
	var term uint64
	for {
		// The term is read before the barrier, which is therefore
		// appended in this term or a later one: if this server still
		// leads in this term afterwards, the barrier committed in it.
		term = lt.cl.Term()
		if !untilDone(ctx, lt.log, "leadership barrier", func() error { return lt.cl.BarrierCtx(ctx, lt.cfg.ApplyTimeout) }) {
			return
		}
		progress.Mark()
		// One entry the state machine sees (this server's registry record):
		// Raft's own no-op and the barrier never reach it, so without this the
		// applied index would trail the commit index, and linearizable reads
		// would wait, until the first tick.
		if !untilDone(ctx, lt.log, "leadership: recording this server", func() error {
			_, _, err := lt.propose(ctx, &fsm.Member{ID: lt.cfg.NodeID, Incarnation: lt.mem.Incarnation()})
			return err
		}) {
			return
		}
		progress.Mark()
		if lt.cl.LeadsIn(term) {
			break
		}
		// Leadership was lost and won again meanwhile: establish it in
		// the current term (or see this term's context end).
		if sleepCtx(ctx, backoff(0)) != nil {
			return
		}
	}
	stuck := false
	if canaryWritesStuck {
		lt.rep.mu.RLock()
		stuck = lt.rep.f.Tick() != 0
		lt.rep.mu.RUnlock()
	}
	lt.ready.Store(&leadership{ctx: ctx, term: term, canaryStuck: stuck})
	// What an earlier term found of the servers' features may be stale (a
	// server added since may not read limited ticks): until this term's
	// first reconcile pass decides, ticks use only what the state records.
	lt.tk.chunkedOK.Store(false)
	lt.tk.pruneOK.Store(false)
	go lt.rc.reconcileLoop(ctx)
	go lt.sc.stateCheckLoop(ctx)
	lt.tk.tickLoop(ctx, progress)
}

// untilDone runs step until it succeeds, with backoff, while the term
// lasts; it reports whether it succeeded. Failures are logged at most once
// in about ten seconds.
func untilDone(ctx context.Context, log *slog.Logger, what string, step func() error) bool {
	for try := 0; ; try++ {
		err := step()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if try%10 == 0 {
			log.Warn(what+" failed; retrying", "err", err, "attempt", try+1)
		}
		if sleepCtx(ctx, backoff(try)) != nil {
			return false
		}
	}
}

// leaderStall is how long a leader may go without committing an entry of
// its own term before it gives leadership up: a few seconds, well above a
// healthy commit's milliseconds and Raft's failover time.
func (c *Config) leaderStall() time.Duration {
	return max(3*time.Second, 3*c.TickPeriod, 4*c.RaftTimeout)
}
