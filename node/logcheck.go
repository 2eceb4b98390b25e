package node

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/prometheus/client_golang/prometheus"
)

// A leader replicates its log from its own disk. An entry that rotted
// there after the leader applied it (its checksum no longer matches, see
// fsm.VerifyChecksum) must not reach a follower, which would stop on it:
// one rotted disk would take every follower that catches up from it out of
// service. So on the leader the log store answers such an entry as not
// found; Raft then sends the follower a snapshot instead, and the leader
// takes a fresh one (its state is sound: it applied the entry before the
// bytes changed), which also spares its own restart the damaged entry.
// Entries not yet applied here pass unchanged: the apply path stops on
// them with a message that names the entry (replica.go). The same holds
// for an entry whose index or type rotted (entryFraming), except that the
// state machine would never see it: the read itself stops the server.

// rotWatch counts and reports damaged entries the leader refused to send.
type rotWatch struct {
	refused prometheus.Counter
	mu      sync.Mutex
	seen    map[uint64]bool // indexes reported (bounded)
	lastRun time.Time       // the last snapshot taken for a damaged entry
}

func newRotWatch(reg prometheus.Registerer) *rotWatch {
	w := &rotWatch{seen: map[uint64]bool{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "leasehold_log_entries_damaged_total",
			Help: "Reads of a log entry this leader had applied whose checksum no longer matched (bit rot on its disk): refused to followers, who get a snapshot instead."})}
	if reg != nil {
		reg.MustRegister(w.refused)
	}
	return w
}

// rotSnapshotEvery bounds the snapshots taken because of damaged entries.
const rotSnapshotEvery = 30 * time.Second

// checkedLogs is the log store as the node hands it to Raft (see above).
type checkedLogs struct {
	raft.LogStore
	clP *atomic.Pointer[cluster.Cluster] // set once Raft runs
	rep *replica
	rot *rotWatch
	log *slog.Logger
}

func (s checkedLogs) GetLog(index uint64, l *raft.Log) error {
	if err := s.LogStore.GetLog(index, l); err != nil {
		return err
	}
	if l.Type == raft.LogCommand && fsm.VerifyChecksum(l.Data) == nil {
		return nil
	}
	framing := entryFraming(index, l)
	if l.Type != raft.LogCommand && framing == nil {
		return nil
	}
	c := s.clP.Load()
	if c == nil || !c.IsLeader() || index > s.rep.applied.Load() {
		if framing != nil && index > s.rep.applied.Load() {
			// Raft would skip the entry without a word (a no-op, a
			// barrier) or stop on it without naming the cause: the
			// state machine never sees it, so the server stops here.
			s.rep.stop(index, "is damaged", framing)
		}
		return nil
	}
	s.rot.refused.Inc()
	w := s.rot
	w.mu.Lock()
	first := !w.seen[index]
	if first && len(w.seen) < 1024 {
		w.seen[index] = true
	}
	snap := time.Since(w.lastRun) >= rotSnapshotEvery
	if snap {
		w.lastRun = time.Now()
	}
	w.mu.Unlock()
	if first {
		s.log.Error("log entry damaged on this server's disk (its checksum does not match, or its index or type changed): not sent to followers, they get a snapshot instead; "+
			"check the disk, and replace this server's data directory when convenient (hand leadership on, stop it, wipe it, let it rejoin)",
			"index", index)
	}
	if snap {
		go func() {
			if err := c.Snapshot().Error(); err != nil {
				s.log.Warn("snapshot after a damaged log entry failed", "err", err)
			}
		}()
	}
	return raft.ErrLogNotFound
}

// ErrEntryFraming is the error for a log entry whose index or type does
// not fit what it carries: bit rot outside the command's bytes, which the
// command checksum (fsm.VerifyChecksum) does not cover. One flipped bit in
// the type turns a command into a no-op or a barrier that Raft never hands
// to the state machine.
var ErrEntryFraming = errors.New("leasehold: log entry's index or type damaged")

// entryFraming checks what the command checksum leaves out: the entry read
// at index says it is at index, and its type is one Raft writes, with data
// only where Raft puts data (commands and configurations; no-ops and
// barriers carry none), as for every entry Raft ever wrote. It returns nil for a sound
// entry, else an error wrapping ErrEntryFraming. Not covered: the term (a
// follower's damaged term makes the leader overwrite the entry; a single
// server never reads terms to apply) and a type that changes between
// command and configuration (Raft stops on a configuration that does not
// decode, and the state machine on a command that does not).
func entryFraming(index uint64, l *raft.Log) error {
	if l.Index != index {
		return fmt.Errorf("%w: the entry read at index %d says it is at index %d", ErrEntryFraming, index, l.Index)
	}
	switch l.Type {
	case raft.LogCommand, raft.LogConfiguration:
		return nil
	case raft.LogNoop, raft.LogBarrier, raft.LogAddPeerDeprecated, raft.LogRemovePeerDeprecated:
		if len(l.Data) == 0 {
			return nil
		}
		return fmt.Errorf("%w: a %s entry carries %d bytes of data (a command whose type changed?)", ErrEntryFraming, l.Type, len(l.Data))
	}
	return fmt.Errorf("%w: unknown entry type %d", ErrEntryFraming, uint8(l.Type))
}

// checkedStores is the store wrapper the node hands the cluster: inner's,
// the log store's write watch (logwatch.go), and checkedLogs outermost.
func checkedStores(watch *logWatch, check checkedLogs, inner storeWrapper) storeWrapper {
	watched := watch.wrap(inner)
	return func(logs raft.LogStore, stable raft.StableStore) (raft.LogStore, raft.StableStore) {
		logs, stable = watched(logs, stable)
		if canaryLoseTail {
			canaryDropTail(logs)
		}
		check.LogStore = logs
		return check, stable
	}
}
