package node

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
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
// them with a message that names the entry (replica.go).

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
	n *Node
}

func (s checkedLogs) GetLog(index uint64, l *raft.Log) error {
	if err := s.LogStore.GetLog(index, l); err != nil {
		return err
	}
	if l.Type != raft.LogCommand || fsm.VerifyChecksum(l.Data) == nil {
		return nil
	}
	n := s.n
	c := n.clP.Load()
	if c == nil || !c.IsLeader() || index > n.rep.applied.Load() {
		return nil
	}
	n.rot.refused.Inc()
	w := n.rot
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
		n.log.Error("log entry damaged on this server's disk (its checksum does not match): not sent to followers, they get a snapshot instead; "+
			"check the disk, and replace this server's data directory when convenient (hand leadership on, stop it, wipe it, let it rejoin)",
			"index", index)
	}
	if snap {
		go func() {
			if err := c.Snapshot().Error(); err != nil {
				n.log.Warn("snapshot after a damaged log entry failed", "err", err)
			}
		}()
	}
	return raft.ErrLogNotFound
}

// checkedStores is the store wrapper the node hands the cluster: inner's,
// the log store's write watch (logwatch.go), and checkedLogs outermost.
func checkedStores(n *Node, inner storeWrapper) storeWrapper {
	watched := n.logs.wrap(inner)
	return func(logs raft.LogStore, stable raft.StableStore) (raft.LogStore, raft.StableStore) {
		logs, stable = watched(logs, stable)
		if canaryLoseTail {
			canaryDropTail(logs)
		}
		return checkedLogs{LogStore: logs, n: n}, stable
	}
}
