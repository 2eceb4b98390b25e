package node

import (
	"cmp"
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// ticker is the cluster clock as the leader runs it: one tick per period
// into the log, and the Expire entries that drain what a limited tick left
// due.
type ticker struct {
	cfg     *Config
	log     *slog.Logger
	rep     *replica
	metrics *nodeMetrics
	// propose commits a tick or an Expire entry; recorded and featureOK
	// say whether the state records a feature, or every server of ids
	// reads it.
	propose   func(context.Context, fsm.Command) (fsm.Result, uint64, error)
	recorded  func(fsm.Features) bool
	featureOK func(fsm.Features, []string) bool
	// chunkedOK: every server of the configuration applies limited ticks
	// and Expire entries (updateChunkedExpiry), so ticks may be limited.
	chunkedOK atomic.Bool
	// pruneOK: every server of the configuration applies ticks with a
	// prune limit (updateChunkedExpiry).
	pruneOK atomic.Bool
}

// tickLoop is the cluster clock. It waits one period after gaining
// leadership before the first tick (a new leader must not compress time;
// only a new cluster, at tick 0, starts its clock at once), proposes tick
// k+1 only after tick k has applied here, and never sooner than one period
// after it proposed tick k: committed ticks are therefore never closer than
// one period in real time, except that one tick may follow its predecessor
// quickly after a stall (fsm.GraceTicks covers it). Every tick it commits
// counts as progress for the watchdog.
func (tk *ticker) tickLoop(ctx context.Context, progress *cluster.Progress) {
	period := tk.period()
	if period != tk.cfg.TickPeriod {
		tk.log.Warn("the cluster's tick period was fixed by its first tick; ignoring the configured one",
			"tick_period", period, "configured", tk.cfg.TickPeriod)
	}
	retain := uint64((tk.cfg.Retention + period - 1) / period)
	first := period
	tk.rep.mu.RLock()
	if tk.rep.f.Tick() == 0 || canaryTickAtOnce {
		// A new cluster: no earlier tick exists that a quick first one
		// could crowd, so the clock starts at once.
		first = 0
	}
	stops := canaryClockStops && tk.rep.f.Tick() != 0
	tk.rep.mu.RUnlock()
	if stops {
		<-ctx.Done()
		return
	}
	timer := newClockTimer(first)
	defer timer.Stop()
	ticked := false
	var lastCommit time.Time // of this term's previous tick
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		// Both cases may have been ready: a term that has ended must not
		// propose (a tick of an old loop committed in a later term would
		// crowd that term's first tick).
		if ctx.Err() != nil {
			return
		}
		if tk.clockHeld() {
			progress.Mark() // held on purpose: not a stall
			timer.Reset(period)
			continue
		}
		sent := monoNow()
		tk.rep.mu.RLock()
		next := tk.rep.f.Tick() + 1
		tk.rep.mu.RUnlock()
		expireMax := tk.tickChunk()
		_, _, err := tk.propose(ctx, &fsm.Tick{Tick: next, WallMS: wallNow().UnixMilli(),
			PeriodMS: period.Milliseconds(), RetainTicks: retain, RetainMax: uint64(tk.cfg.MaxRetained),
			ExpireMax: expireMax, PruneMax: tk.tickPrune(expireMax)})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			tk.log.Warn("tick not committed", "tick", next, "err", err)
		} else {
			if !ticked {
				tk.log.Info("first tick of this leadership term committed", "tick", next)
				ticked = true
			}
			progress.Mark()
			now := monoNow()
			if !lastCommit.IsZero() {
				tk.metrics.tickInterval.Observe(now.Sub(lastCommit).Seconds())
			}
			lastCommit = now
			tk.drainExpiry(ctx, next, progress)
		}
		timer.Reset(max(sent.Add(period).Sub(monoNow()), 0))
	}
}

// clockHeld reports whether a test holds the clock (Config.holdClock).
func (tk *ticker) clockHeld() bool { return tk.cfg.holdClock != nil && tk.cfg.holdClock(tk.rep) }

// expireChunk bounds the records one tick or Expire entry ends (fsm
// expire.go): small enough that applying it holds writes up for a few
// milliseconds, large enough that a storm of 100,000 expiries takes few
// round trips. Tests set a smaller one (Config.expireChunk).
const expireChunk = 4096

// chunk is the records one tick or Expire entry ends.
func (tk *ticker) chunk() uint64 { return cmp.Or(tk.cfg.expireChunk, expireChunk) }

// tickChunk is the ExpireMax of the next tick: the chunk once every server
// of the configuration reads limited ticks and Expire entries
// (chunkedOK), else 0, an unlimited tick of the older entry type.
func (tk *ticker) tickChunk() uint64 {
	if !tk.chunkedOK.Load() && !tk.recorded(fsm.FeatureChunkedExpiry) {
		return 0
	}
	return tk.chunk()
}

// tickPrune is the PruneMax of the next tick, whose ExpireMax is
// expireMax: the chunk once every server of the configuration reads ticks
// with a prune limit (pruneOK), which carry an expiry limit too, else 0
// (the tick prunes all that is due, in one entry).
func (tk *ticker) tickPrune(expireMax uint64) uint64 {
	if expireMax == 0 || !tk.pruneOK.Load() && !tk.recorded(fsm.FeatureChunkedPrune) {
		return 0
	}
	return tk.chunk()
}

// updateChunkedExpiry records whether every server of the configuration
// (ids) reads chunked expiry, and chunked pruning: recorded in the state,
// or every server but this one announces it in gossip (features.go).
func (tk *ticker) updateChunkedExpiry(ids []string) {
	tk.chunkedOK.Store(tk.featureOK(fsm.FeatureChunkedExpiry, ids))
	tk.pruneOK.Store(tk.featureOK(fsm.FeatureChunkedPrune, ids))
}

// expireDepth is how many Expire entries drainExpiry keeps in flight: the
// next chunk commits while the one before applies, and a write proposed
// meanwhile waits behind at most this many chunks.
const expireDepth = 2

// drainExpiry proposes Expire entries, at most expireDepth at a time so
// that the writes proposed meanwhile commit between them, until what tick
// left due has ended (or the tick has passed, or leadership is lost).
func (tk *ticker) drainExpiry(ctx context.Context, tick uint64, progress *cluster.Progress) {
	done := make(chan error, expireDepth)
	inflight := 0
	defer func() {
		for ; inflight > 0; inflight-- {
			<-done
		}
	}()
	for ctx.Err() == nil {
		tk.rep.mu.RLock()
		left := 0
		if tk.rep.f.Tick() == tick {
			left = tk.rep.f.Backlog()
		}
		tk.rep.mu.RUnlock()
		// Once a server that does not read Expire entries is in the
		// configuration, none is proposed: the next tick is unlimited
		// and ends what is left.
		if tk.chunkedOK.Load() && uint64(left) > uint64(inflight)*tk.chunk() && inflight < expireDepth && !tk.clockHeld() {
			inflight++
			go func() {
				_, _, err := tk.propose(ctx, &fsm.Expire{Tick: tick, WallMS: wallNow().UnixMilli(), Max: tk.chunk()})
				done <- err
			}()
			continue
		}
		if inflight == 0 {
			return
		}
		err := <-done
		inflight--
		if err != nil {
			if ctx.Err() == nil {
				tk.log.Warn("expiry not committed", "tick", tick, "err", err)
			}
			return
		}
		// A committed chunk is this term's progress as much as a tick:
		// the watchdog must not hand on a leader draining a long storm.
		progress.Mark()
	}
}

// period is the cluster's tick period.
func (tk *ticker) period() time.Duration {
	tk.rep.mu.RLock()
	defer tk.rep.mu.RUnlock()
	return time.Duration(tk.rep.period()) * time.Millisecond
}
