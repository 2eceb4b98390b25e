package node

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// replica adapts the pure state machine to raft.FSM: it decodes entries,
// serialises Apply against readers, and hands events to the hub and wait
// notices to the waiting proposers.
type replica struct {
	mu      sync.RWMutex
	f       *fsm.FSM
	applied atomic.Uint64 // last applied Raft index, any entry type
	// movedAt (time since born when applied last advanced) and tick are
	// readable without mu, so a server stuck in Apply still says so.
	born     time.Time
	movedAt  atomic.Int64
	tick     atomic.Uint64
	features atomic.Uint64 // fsm.Features, readable without mu

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
	started  atomic.Bool
	leading  func() bool
	restores atomic.Uint64 // since start: installs from a leader and operator restores
	// broken is set at the first committed entry that does not decode:
	// nothing is applied after it (corrupt, a test's hook, replaces the
	// panic that stops the server).
	broken  atomic.Pointer[string]
	corrupt func(index uint64, err error)
	skew    func(fsm.Command) fsm.Command // a test's deliberately diverged replica
	// skipRestore is Config.SkipRestore: the restore whose commit this
	// server applies as a refusal.
	skipRestore string
	// applyingRestore is set while a restore commit applies (the
	// watchdog counts it as progress: backup.go).
	applyingRestore atomic.Bool
	installed       atomic.Uint64 // since start: snapshots sent by a leader
	// replayEnd is the last index of the log when the node started: the
	// events of entries up to it were counted by the run that first
	// applied them, and are not counted again (metrics.go).
	replayEnd atomic.Uint64
	metrics   *nodeMetrics
	// sums are the checksums of the snapshots this process wrote, for
	// SaveSnapshot's file header.
	sums snapshotSums
	// opened is the metadata of the snapshot Raft opened last
	// (snapshotOpened): Raft opens the one it restores just before Restore.
	opened atomic.Pointer[raft.SnapshotMeta]
}

var (
	_ raft.FSM         = (*replica)(nil)
	_ raft.BatchingFSM = (*replica)(nil)
)

func newReplica(h *hub, stats *counters, notices func([]fsm.Notice)) *replica {
	return &replica{f: fsm.New(), appliedCond: make(chan struct{}), hub: h, stats: stats, notices: notices,
		scans: make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2)), born: time.Now()}
}

// Apply implements raft.FSM.
func (r *replica) Apply(l *raft.Log) any { return r.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch implements raft.BatchingFSM. A committed entry that does not
// decode means replicas are about to diverge: it panics rather than skip.
func (r *replica) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	events := r.evbuf[:0]
	var notices []fsm.Notice
	var resets []hubReset
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
			if r.broken.Load() != nil {
				out[i] = []fsm.Result{{Err: fsm.Errorf(wire.CodeInternal, "this server stopped applying at a log entry it cannot apply")}}
				continue
			}
			cmd, err := fsm.Decode(l.Data)
			if err != nil {
				// Damaged or from a newer release (fsm.ErrUnknownType):
				// applying on would diverge.
				msg := r.stop(l.Index, "does not decode", err)
				out[i] = []fsm.Result{{Err: fsm.Errorf(wire.CodeInternal, "%s", msg)}}
				continue
			}
			if r.skew != nil {
				cmd = r.skew(cmd)
			}
			rc, restoring := cmd.(*fsm.RestoreCommit)
			if restoring {
				if r.skipRestore != "" && rc.ID == r.skipRestore {
					rc.Skip = true // the operator's way out (Config.SkipRestore)
				}
				r.applyingRestore.Store(true)
				if h := restoreApplyHook.Load(); h != nil {
					(*h)()
				}
			}
			res := r.f.Apply(l.Index, cmd)
			out[i] = res
			if restoring {
				r.applyingRestore.Store(false)
				if res[0].Restore != nil {
					// Events before it go out, then history restarts here.
					resets = append(resets, hubReset{index: l.Index, at: len(events)})
				}
			}
			r.f.DrainEvents(func(e *fsm.Event) { events = append(events, r.annotate(e)) })
			notices = append(notices, r.f.TakeNotices()...)
		}
		r.pos.Store(l.Index)
		if r.hashWant.Load() > 0 {
			r.serveHashes(l.Index)
		}
	}
	tick := r.f.Tick()
	r.features.Store(uint64(r.f.Features()))
	r.mu.Unlock()
	r.tick.Store(tick)
	if last > 0 {
		r.setApplied(last)
	}
	r.countEvents(events)
	from := 0
	for _, rs := range resets {
		r.hub.publish(events[from:rs.at])
		r.hub.reset(rs.index)
		from = rs.at
		if r.started.Load() {
			r.restores.Add(1)
		}
	}
	r.hub.publish(events[from:])
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

// stop records that the committed entry at index cannot be applied (what
// is wrong with it, err why) and stops this server: it panics, or with a
// test's corrupt hook reports it and returns the message. Nothing is
// applied after it (ApplyBatch refuses every later command), and ReadyErr
// reports the message, which says what to do: upgrade the binary for an
// entry of a newer release (fsm.ErrUnknownType), else wipe or restore.
// Safe to call from any goroutine; the first call wins the message.
func (r *replica) stop(index uint64, what string, err error) string {
	advice := "its log is damaged: wipe its data directory and let it rejoin, or restore it from a backup"
	if errors.Is(err, fsm.ErrUnknownType) {
		// Wiped, it would rejoin and stop at the same entry.
		advice = "the entry was written by a newer release: upgrade this server's binary and restart it; " +
			"do not wipe its data directory, its log is not damaged"
	}
	msg := fmt.Sprintf("leasehold: committed log entry %d %s: %v; this server stops (%s)", index, what, err, advice)
	if !r.broken.CompareAndSwap(nil, &msg) {
		msg = *r.broken.Load()
	}
	if r.corrupt == nil {
		panic(msg)
	}
	r.corrupt(index, err)
	return msg
}

// restoreApplyHook, set by tests only, runs before a restore commit
// applies (a stand-in for a large state's decoding and rebase).
var restoreApplyHook atomic.Pointer[func()]

// hubReset is a restore applied in a batch: the event history restarts
// after index, once the first at events (those before it) are published.
type hubReset struct {
	index uint64
	at    int
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

// readyCatchUp is how long ReadyErr waits for entries committed but not
// yet applied.
const readyCatchUp = 500 * time.Millisecond

// appliedBy reports whether this replica has applied index, waiting up to
// within for it (or until stop is closed).
func (r *replica) appliedBy(index uint64, within time.Duration, stop <-chan struct{}) bool {
	var timeout <-chan time.Time
	for {
		ch, applied := r.waitApplied()
		if applied >= index {
			return true
		}
		if timeout == nil {
			t := time.NewTimer(within)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			return false
		case <-stop:
			return false
		}
	}
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
	return &fsmSnapshot{s: r.f.Snapshot(), metrics: r.metrics, sums: &r.sums}, nil
}

// Restore implements raft.FSM: it replaces all state with the snapshot's.
// Raft calls it at startup and on a follower sent a snapshot (an operator's
// restore goes through the log: RestoreCommit). The applied index never goes
// back; the event history restarts after the snapshot's index (older resumes
// get EVENTS_COMPACTED, live subscriptions end); queued-acquire waiters are
// not touched.
//
// A snapshot older than the state is refused (ErrStaleSnapshot):
// hashicorp/raft v1.7.3 installs whatever a leader sends and then panics
// with "log not found" looking for entries already compacted here. The
// leader then sends a newer one.
func (r *replica) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<16)
	if err := r.staleSnapshot(br); err != nil {
		return err
	}
	f := fsm.New()
	if err := f.Restore(br); err != nil {
		return err
	}
	r.mu.Lock()
	if have := r.f.Index(); f.Index() < have {
		r.mu.Unlock()
		return fmt.Errorf("%w: the snapshot's state is at index %d, this server's at %d", ErrStaleSnapshot, f.Index(), have)
	}
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
	r.tick.Store(f.Tick())
	r.features.Store(uint64(f.Features()))
	r.setApplied(max(r.applied.Load(), f.Index()))
	r.hub.reset(f.Index())
	return nil
}

// staleSnapshot refuses (ErrStaleSnapshot) the snapshot br starts with when
// it is older than what this server applied: its Raft index (the metadata
// Raft opened last, taken once) below the last entry applied here, or the
// last command its header names below the state's. Nothing of br is
// consumed.
func (r *replica) staleSnapshot(br *bufio.Reader) error {
	m := r.opened.Swap(nil)
	idx, ok := fsm.PeekIndex(br)
	if !ok {
		return nil // Restore says what is wrong with it
	}
	// A snapshot's Raft index is at least its state's (the last command);
	// metadata below that is another snapshot's (a leader sending its own,
	// a backup opening one), and says nothing of this one.
	if applied := r.applied.Load(); m != nil && m.Index >= idx && m.Index < applied {
		return fmt.Errorf("%w: the snapshot is at Raft index %d, this server applied up to %d", ErrStaleSnapshot, m.Index, applied)
	}
	r.mu.RLock()
	have := r.f.Index()
	r.mu.RUnlock()
	if idx < have {
		return fmt.Errorf("%w: the snapshot's state is at index %d, this server's at %d", ErrStaleSnapshot, idx, have)
	}
	return nil
}

// snapshotOpened records the metadata of a snapshot Raft opened
// (cluster.Config.SnapshotOpened).
func (r *replica) snapshotOpened(meta raft.SnapshotMeta) { r.opened.Store(&meta) }

// ErrStaleSnapshot is a snapshot from a leader that is older than what
// this server has applied: installing it would move the state back.
var ErrStaleSnapshot = errors.New("leasehold: refused a snapshot older than this server's state")

// setApplied records the applied index, and when it moved.
func (r *replica) setApplied(i uint64) {
	if r.applied.Swap(i) != i {
		r.movedAt.Store(int64(time.Since(r.born)))
	}
}

// sinceMoved is how long ago the applied index last advanced (since the
// node started, if it never did).
func (r *replica) sinceMoved() time.Duration {
	return time.Since(r.born) - time.Duration(r.movedAt.Load())
}

type fsmSnapshot struct {
	s       *fsm.Snapshot
	metrics *nodeMetrics
	sums    *snapshotSums
}

// Persist writes the snapshot into sink while it encodes it
// (aheadWriter), and records its SHA-256 once it is complete.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := monoNow()
	h := sha256.New()
	aw := newAheadWriter(io.MultiWriter(sink, h))
	size, err := s.s.WriteTo(aw)
	if cerr := aw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		sink.Cancel()
	} else if err = sink.Close(); err == nil && s.sums != nil {
		s.sums.put(sink.ID(), snapshotSum{size: size, sha256: [sha256.Size]byte(h.Sum(nil))})
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

// snapshotSums remembers the size and SHA-256 of the last few snapshots
// this process wrote, by Raft's snapshot id, for SaveSnapshot's file header
// (saving a second pass over the snapshot).
type snapshotSums struct {
	mu   sync.Mutex
	last [4]struct {
		id  string
		sum snapshotSum
	}
	next int
}

type snapshotSum struct {
	size   int64
	sha256 [sha256.Size]byte
}

func (ss *snapshotSums) put(id string, sum snapshotSum) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e := &ss.last[ss.next%len(ss.last)]
	e.id, e.sum = id, sum
	ss.next++
}

// get returns the sum last recorded for id (the newest first: an
// in-memory store names snapshots by term and index, which can recur).
func (ss *snapshotSums) get(id string) (snapshotSum, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k := 1; k <= len(ss.last); k++ {
		e := &ss.last[(ss.next-k+len(ss.last)*2)%len(ss.last)]
		if e.id == id && id != "" {
			return e.sum, true
		}
	}
	return snapshotSum{}, false
}

func (r *replica) lookupActive(id string) *fsm.Lease {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if l := r.f.Lease(id); l != nil && l.State == fsm.StateActive {
		return l
	}
	return nil
}

// lookupGroup returns the members of group g if it is granted and active.
func (r *replica) lookupGroup(g string) []*fsm.Lease {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ls := r.f.Group(g)
	if len(ls) == 0 || ls[0].State != fsm.StateActive {
		return nil
	}
	return ls
}
