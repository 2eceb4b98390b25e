package node

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
)

// replica adapts the pure state machine to raft.FSM: it decodes entries,
// serialises Apply against readers, and hands events to the hub and wait
// notices to the waiting proposers.
type replica struct {
	mu      sync.RWMutex
	f       *fsm.FSM
	applied atomic.Uint64 // last applied Raft index, any entry type

	appliedMu   sync.Mutex
	appliedCond chan struct{} // closed and replaced on every apply

	hub           *hub
	evbuf         []hubEvent // reused by ApplyBatch, which Raft never runs concurrently
	defaultPeriod int64
	notices       func([]fsm.Notice)
	stats         *counters
	// scans bounds the listing chunks (read.go) running at once, so that
	// listings, however many, leave processors to Apply and the ticks.
	scans chan struct{}

	// pos is the index of the last entry processed (any type): the state
	// is the one after it. Written under mu; read by hash requests.
	pos atomic.Uint64
	// hashes are the pending state-hash requests (local.go); hashWant is
	// their count, so that an apply with none pending costs one load.
	hashMu   sync.Mutex
	hashes   []*hashReq
	hashWant atomic.Int64
	// started is set once the node runs (restores before it are the
	// startup's); leading reports whether this node leads now.
	started   atomic.Bool
	leading   func() bool
	restores  atomic.Uint64 // since start: installs from a leader and operator restores
	installed atomic.Uint64 // since start: snapshots sent by a leader
	// replayEnd is the last index of the log when the node started: the
	// events of entries up to it were counted by the run that first
	// applied them, and are not counted again (metrics.go).
	replayEnd atomic.Uint64
	metrics   *nodeMetrics
}

var (
	_ raft.FSM         = (*replica)(nil)
	_ raft.BatchingFSM = (*replica)(nil)
)

func newReplica(h *hub, stats *counters, notices func([]fsm.Notice)) *replica {
	return &replica{f: fsm.New(), appliedCond: make(chan struct{}), hub: h, stats: stats, notices: notices,
		scans: make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2))}
}

// Apply implements raft.FSM.
func (r *replica) Apply(l *raft.Log) any { return r.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch implements raft.BatchingFSM. A committed entry that does not
// decode means replicas are about to diverge: it panics rather than skip.
func (r *replica) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	events := r.evbuf[:0]
	var notices []fsm.Notice
	r.mu.Lock()
	last := uint64(0)
	for i, l := range logs {
		if r.hashWant.Load() > 0 {
			// Entries Raft keeps to itself (no-ops, barriers) left the
			// state as it is: it is the state after each of them.
			r.serveHashes(l.Index - 1)
		}
		last = l.Index
		if l.Type == raft.LogCommand {
			cmd, err := fsm.Decode(l.Data)
			if err != nil {
				panic(fmt.Sprintf("leasehold: undecodable committed entry at index %d: %v", l.Index, err))
			}
			out[i] = r.f.Apply(l.Index, cmd)
			r.f.DrainEvents(func(e *fsm.Event) { events = append(events, r.annotate(e)) })
			notices = append(notices, r.f.TakeNotices()...)
		}
		r.pos.Store(l.Index)
		if r.hashWant.Load() > 0 {
			r.serveHashes(l.Index)
		}
	}
	r.mu.Unlock()
	if last > 0 {
		r.applied.Store(last)
	}
	r.countEvents(events)
	r.hub.publish(events)
	clear(events)
	r.evbuf = events[:0]
	if len(notices) > 0 && r.notices != nil {
		r.notices(notices)
	}
	r.appliedMu.Lock()
	close(r.appliedCond)
	r.appliedCond = make(chan struct{})
	r.appliedMu.Unlock()
	return out
}

// annotate captures, under the apply lock, what rendering the event later
// needs from the state (a bound lease's end comes from its session).
func (r *replica) annotate(e *fsm.Event) hubEvent {
	he := hubEvent{Event: *e, period: r.period()}
	if e.Lease != nil {
		he.endTick = e.Lease.ExpiresTick
		he.ttlMS = e.Lease.TTLMS
		if e.Lease.SessionID != "" {
			if s := r.f.Session(e.Lease.SessionID); s != nil {
				he.endTick, he.ttlMS = s.ExpiresTick, s.TTLMS
			}
		}
	}
	return he
}

// waitApplied returns a channel closed at the next apply, and the applied
// index as of now.
func (r *replica) waitApplied() (<-chan struct{}, uint64) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	return r.appliedCond, r.applied.Load()
}

// Snapshot implements raft.FSM. Capturing is cheap; encoding happens in
// Persist while Apply goes on.
func (r *replica) Snapshot() (raft.FSMSnapshot, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return &fsmSnapshot{s: r.f.Snapshot(), metrics: r.metrics}, nil
}

// Restore implements raft.FSM: it discards all state and replaces it. Raft
// calls it at startup (the latest snapshot), on a follower that was sent a
// snapshot, and on the leader for an operator's restore (Node.
// RestoreSnapshot), whose state Rebase moved to an index at or above
// everything applied before, so that:
//   - the applied index never goes back (the snapshot's index is at least
//     what was applied);
//   - the event history restarts after the snapshot's index: a resume from
//     an earlier event is EVENTS_COMPACTED, and live subscriptions end the
//     same way (hub.reset), since the state they followed was replaced;
//     events of later entries have higher ids than any before;
//   - waiters for queued acquires are not touched here: RestoreSnapshot
//     answers them (a follower has none; at startup there are none yet).
func (r *replica) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	f := fsm.New()
	if err := f.Restore(rc); err != nil {
		return err
	}
	r.mu.Lock()
	r.f = f
	r.pos.Store(max(r.pos.Load(), f.Index()))
	r.failHashes(f.Index())
	r.mu.Unlock()
	if r.started.Load() {
		r.restores.Add(1)
		if r.leading == nil || !r.leading() {
			r.installed.Add(1)
		}
	}
	r.applied.Store(max(r.applied.Load(), f.Index()))
	r.hub.reset(f.Index())
	return nil
}

type fsmSnapshot struct {
	s       *fsm.Snapshot
	metrics *nodeMetrics
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := monoNow()
	size, err := s.s.WriteTo(sink)
	if err != nil {
		sink.Cancel()
	} else {
		err = sink.Close()
	}
	if m := s.metrics; m != nil {
		outcome := "ok"
		if err != nil {
			outcome = "failed"
		} else {
			m.snapshotDuration.Observe(monoNow().Sub(start).Seconds())
			m.snapshotSize.Set(float64(size))
		}
		m.snapshots.WithLabelValues(outcome).Inc()
	}
	return err
}

func (s *fsmSnapshot) Release() {}
