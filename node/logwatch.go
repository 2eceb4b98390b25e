package node

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// Watching Raft's log store. When the disk fills, raft-wal fails to
// preallocate its next segment as it rotates, and from then on refuses
// every append ("segment is sealed") until the process restarts, even once
// space is back: Raft steps down on every failed append, so a single server
// flaps through elections forever, and nothing from outside could tell.
// The log store is wrapped here to see its writes fail:
//   - while they fail, HealthErr (/healthz) and ReadyErr say so;
//   - once the disk has room for a restart again (restartFreeDisk) while
//     appends still fail (at once for raft-wal's sealed segment, after
//     logRecoverGrace for any other error), or after LogFailureTimeout of
//     failures whatever the disk says, the node fails (Failed): the
//     server exits with a distinct status for its supervisor to restart
//     it, and a restart reopens the log with every acknowledged write (an
//     entry is acknowledged only once it is written and fsynced).

// logRecoverGrace: with room on the disk again, appends that go on failing
// for this long (other than raft-wal's sealed segment, which never
// recovers) fail the node. Raft retries an append about every second.
const logRecoverGrace = 3 * time.Second

// logWatch is the state of the log store's writes.
type logWatch struct {
	failingSince atomic.Int64 // unix ns of the first failure since the last success; 0: not failing
	lastFailure  atomic.Int64 // unix ns
	failures     atomic.Uint64
	sealed       atomic.Bool // a failure was raft-wal's sealed segment (permanent)
	lastErr      atomic.Pointer[string]
	roomSince    atomic.Int64 // unix ns since the disk has had room for a restart while failing; 0: none

	failOnce sync.Once
	failed   chan struct{} // closed when the node fails
	failErr  atomic.Pointer[error]

	// Raft's stable store (raft.db: the current term and vote) is
	// watched too: see watchedStable.
	log      *slog.Logger
	released <-chan struct{} // closed when the node closes

	// A write that hangs rather than fails (a stalled disk) returns no
	// error to record: the writes in flight are timed, and one older
	// than hangAfter makes HealthErr fail (hungErr).
	hangAfter time.Duration
	// store is the log store watched, for reads (raftOnly).
	store   atomic.Pointer[watchedLogs]
	wmu     sync.Mutex
	wseq    uint64
	writing map[uint64]time.Time // write -> when it began
}

// DefaultLogWriteHang is how long one write to Raft's log store may take
// before /healthz says the log cannot be written: far above a slow fsync's
// seconds.
const DefaultLogWriteHang = 20 * time.Second

// newLogWatch returns the watch of a node that logs to log and closes
// released when it closes.
func newLogWatch(hangAfter time.Duration, log *slog.Logger, released <-chan struct{}) *logWatch {
	if hangAfter <= 0 {
		hangAfter = DefaultLogWriteHang
	}
	return &logWatch{failed: make(chan struct{}), hangAfter: hangAfter, writing: map[uint64]time.Time{},
		log: log, released: released}
}

// begin notes a write in flight; the function it returns ends it.
func (w *logWatch) begin() func() {
	w.wmu.Lock()
	w.wseq++
	id := w.wseq
	w.writing[id] = time.Now()
	w.wmu.Unlock()
	return func() {
		w.wmu.Lock()
		delete(w.writing, id)
		w.wmu.Unlock()
	}
}

// hungErr describes a write in flight for longer than hangAfter, else nil.
func (w *logWatch) hungErr() error {
	w.wmu.Lock()
	var oldest time.Time
	for _, t := range w.writing {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	w.wmu.Unlock()
	if oldest.IsZero() {
		return nil
	}
	if d := time.Since(oldest); d >= w.hangAfter {
		return fmt.Errorf("a write to the Raft log has not returned for %v (a stalled disk?)", d.Round(time.Second))
	}
	return nil
}

// watchedLogs reports every write's outcome to w; reads pass through.
type watchedLogs struct {
	raft.LogStore
	w *logWatch
}

func (s watchedLogs) StoreLog(l *raft.Log) error {
	defer s.w.begin()()
	return s.w.record(s.LogStore.StoreLog(l))
}

func (s watchedLogs) StoreLogs(ls []*raft.Log) error {
	defer s.w.begin()()
	return s.w.record(s.LogStore.StoreLogs(ls))
}

func (w *logWatch) record(err error) error {
	now := time.Now().UnixNano()
	if err == nil {
		if w.failingSince.Load() != 0 {
			w.failingSince.Store(0)
			w.roomSince.Store(0)
			w.sealed.Store(false)
		}
		return nil
	}
	w.failures.Add(1)
	w.lastFailure.Store(now)
	w.failingSince.CompareAndSwap(0, now)
	msg := err.Error()
	w.lastErr.Store(&msg)
	if errors.Is(err, raftwal.ErrSealed) || strings.Contains(msg, raftwal.ErrSealed.Error()) {
		w.sealed.Store(true)
	}
	return err
}

// wrap returns the store wrapper the node hands the cluster: inner's, then
// the watch around the log store.
func (w *logWatch) wrap(inner storeWrapper) storeWrapper {
	return func(logs raft.LogStore, stable raft.StableStore) (raft.LogStore, raft.StableStore) {
		if inner != nil {
			logs, stable = inner(logs, stable)
		}
		wl := watchedLogs{LogStore: logs, w: w}
		w.store.Store(&wl)
		return wl, watchedStable{StableStore: stable, w: w}
	}
}

// keyCurrentTerm is the stable-store key under which hashicorp/raft keeps
// its current term.
var keyCurrentTerm = []byte("CurrentTerm")

// watchedStable is Raft's stable store, watched for one failure:
// hashicorp/raft panics when (*Raft).setCurrentTerm cannot save a new term
// ("failed to save current term"), taking the whole process down with a
// goroutine dump (status 2), rather than go on without a durable term.
// Such a failure fails the node instead (Failed; the server exits with the
// storage-failure status, as for a wedged log) and holds the goroutine that
// made the call (Raft's own, or its transport's handling a heartbeat from
// a leader of a later term) until the node closes: then that goroutine
// ends (runtime.Goexit, which runs its deferred calls: an RPC still gets
// its refusal, and Raft's shutdown finds its goroutine gone), without
// returning into the panic. The later term is never acted on unsaved.
// Every other write's error, and the term's written elsewhere (a live
// bootstrap, which answers its caller with it), goes back to the caller
// (a vote that cannot be saved is not granted).
type watchedStable struct {
	raft.StableStore
	w *logWatch
}

func (s watchedStable) SetUint64(key []byte, val uint64) error {
	err := s.StableStore.SetUint64(key, val)
	if err == nil || string(key) != string(keyCurrentTerm) || !termSaver() {
		return err
	}
	s.w.fail(s.w.log, fmt.Errorf("the Raft state (current term %d) cannot be saved in raft.db: %w; stopping: "+
		"a restart recovers every acknowledged write once the disk works", val, err))
	<-s.w.released
	runtime.Goexit()
	return err
}

// termSaver reports whether the caller's caller is called by
// hashicorp/raft's setCurrentTerm, the one writer of the term that panics
// on an error (TestTermSaverSeesRaft checks the name against the Raft this
// builds with). A variable for tests.
var termSaver = func() bool {
	var pcs [16]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == "github.com/hashicorp/raft.(*Raft).setCurrentTerm" {
			return true
		}
		if !more {
			return false
		}
	}
}

// failingErr describes the failure while the log's writes fail, else nil.
func (w *logWatch) failingErr() error {
	since := w.failingSince.Load()
	if since == 0 {
		return nil
	}
	msg := ""
	if p := w.lastErr.Load(); p != nil {
		msg = *p
	}
	return fmt.Errorf("the Raft log cannot be written (failing for %v, %d failed writes; last error: %s)",
		time.Since(time.Unix(0, since)).Round(time.Second), w.failures.Load(), msg)
}

// check runs every disk poll with the free bytes (-1: unknown) and fails
// the node when the log is wedged (see above); need is the free space a
// restart needs (Config.restartFreeDisk).
func (w *logWatch) check(log *slog.Logger, timeout time.Duration, free, need int64) {
	since := w.failingSince.Load()
	if since == 0 {
		return
	}
	now := time.Now()
	room := free >= need
	if !room {
		w.roomSince.Store(0)
	} else {
		w.roomSince.CompareAndSwap(0, now.UnixNano())
	}
	failing := w.failingErr()
	if failing == nil {
		return
	}
	switch rs := w.roomSince.Load(); {
	case room && w.sealed.Load():
		w.fail(log, fmt.Errorf("%w; the log store refuses every append until it is reopened (its segment is sealed after a failed rotation, "+
			"typically a full disk) and the disk has room again (%s free): stopping so that a restart reopens it", failing, fmtBytes(free)))
	case room && rs != 0 && w.lastFailure.Load() > rs && now.Sub(time.Unix(0, rs)) >= logRecoverGrace:
		w.fail(log, fmt.Errorf("%w; the disk has had room again (%s free) for %v and the log still fails: stopping so that a restart reopens it",
			failing, fmtBytes(free), now.Sub(time.Unix(0, rs)).Round(time.Second)))
	case timeout > 0 && now.Sub(time.Unix(0, since)) >= timeout:
		w.fail(log, fmt.Errorf("%w; giving up after --log-failure-timeout (%v) with %s free on the data directory's disk: stopping; "+
			"a restart recovers every acknowledged write once the disk has room (at least %s free)",
			failing, timeout, fmtBytes(free), fmtBytes(need)))
	}
}

func (w *logWatch) fail(log *slog.Logger, err error) {
	w.failOnce.Do(func() {
		w.failErr.Store(&err)
		log.Error("storage failure: the node has failed", "err", err)
		close(w.failed)
	})
}

// logFailureTimeout is Config.LogFailureTimeout or its default; 0: never.
func (c *Config) logFailureTimeout() time.Duration {
	switch t := c.LogFailureTimeout; {
	case t < 0:
		return 0
	case t == 0:
		return DefaultLogFailureTimeout
	default:
		return t
	}
}

// restartFreeDisk is the free space a restart needs: RestartFreeDisk, or
// with a raft-wal segment size set (WALSegmentSize, for tests) one such
// segment and the same 1 MiB margin.
func (c *Config) restartFreeDisk() int64 {
	if c.WALSegmentSize > 0 {
		return int64(c.WALSegmentSize) + 1<<20
	}
	return RestartFreeDisk
}

// Defaults of the log watch.
const (
	// DefaultLogFailureTimeout is the default of Config.LogFailureTimeout.
	DefaultLogFailureTimeout = 60 * time.Second
	// RestartFreeDisk is the free space a restart needs to reopen a log
	// whose rotation failed: a new 64 MiB segment and a margin.
	RestartFreeDisk int64 = 65 << 20
)

// fmtBytes renders a byte count for messages.
func fmtBytes(b int64) string {
	switch {
	case b < 0:
		return "unknown"
	case b >= 10<<30:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 10<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 10<<10:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}
