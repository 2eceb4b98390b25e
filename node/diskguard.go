package node

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// The free-space guard, after etcd's NOSPACE alarm. A server whose data
// directory's filesystem has less than Config.MinFreeDisk free is "low":
// while the leader, or any voter it hears of through gossip, is low, the
// leader refuses the writes that grow the state (acquire, session create)
// before proposing them, with RESOURCE_EXHAUSTED (field "min_free_disk").
// Renewals, heartbeats, releases and revokes go on: they keep the current
// holders safe and end leases, which frees space once a snapshot compacts
// the log. The free space is read every diskPoll with statfs, never per
// request.

// Defaults of the guard.
const (
	// DefaultMinFreeDisk is the floor of the default threshold: one more
	// raft-wal segment (64 MiB, preallocated when the log rotates) and a
	// snapshot, with room to spare.
	DefaultMinFreeDisk int64 = 256 << 20
)

// diskPoll is how often the free space is read.
var diskPoll = time.Second

// diskRecheck is how old this server's free-space reading may be when a
// growing write is checked: an older one is read again first (a statfs),
// so that a burst of writes cannot run far past the threshold between two
// polls.
const diskRecheck = 20 * time.Millisecond

// peerDiskFresh is how recent a peer's gossiped disk report must be to
// count.
const peerDiskFresh = 10 * time.Second

// diskGuard is the guard's state, read by requests without locks.
type diskGuard struct {
	cfg     *Config
	log     *slog.Logger
	rep     *replica
	mem     *cluster.Members
	metrics *nodeMetrics
	logs    *logWatch                        // checked at every poll
	clP     *atomic.Pointer[cluster.Cluster] // set once Raft runs
	wg      *sync.WaitGroup                  // the node's goroutines
	closing <-chan struct{}

	free      atomic.Int64 // bytes available to this process on the data dir's fs; -1: unknown
	threshold atomic.Int64 // bytes; 0: the guard is off
	low       atomic.Bool  // free < threshold
	// refusal is why the leader refuses growing writes now (this server
	// or a voter is low); nil: they are accepted.
	refusal atomic.Pointer[wire.Error]
	// peersLow describes the voters gossip reports low (the leader's
	// view); "" when none.
	peersLow atomic.Pointer[string]
	// readAt is when free was last read (monoNow().UnixNano()); a
	// growing write that finds it older than diskRecheck reads it again.
	readAt atomic.Int64
}

// diskOn reports whether this node watches a disk at all.
func (g *diskGuard) diskOn() bool { return !g.cfg.InMemory && g.cfg.DataDir != "" }

// statfsFree is the space available to an unprivileged writer on the
// filesystem of dir.
func statfsFree(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// latestSnapshotBytes is the size of the largest snapshot kept in dir
// (Raft keeps the latest two; they are about the same size).
func latestSnapshotBytes(dir string) int64 {
	entries, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil {
		return 0
	}
	var most int64
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "snapshots", e.Name(), "state.bin")); err == nil {
			most = max(most, fi.Size())
		}
	}
	return most
}

// minFreeDisk is the guard's threshold now: Config.MinFreeDisk, or by
// default max(DefaultMinFreeDisk, twice the latest snapshot); 0 when off.
func (g *diskGuard) minFreeDisk() int64 {
	switch {
	case g.cfg.MinFreeDisk < 0:
		return 0
	case g.cfg.MinFreeDisk > 0:
		return g.cfg.MinFreeDisk
	}
	return max(DefaultMinFreeDisk, 2*latestSnapshotBytes(g.cfg.DataDir))
}

// startDiskGuard reads the free space once (so that the first requests
// see it) and starts the poll.
func (g *diskGuard) startDiskGuard() {
	g.free.Store(-1)
	g.registerDiskMetrics()
	if !g.diskOn() {
		return
	}
	g.pollDisk()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		t := time.NewTicker(diskPoll)
		defer t.Stop()
		for {
			select {
			case <-g.closing:
				return
			case <-t.C:
				g.pollDisk()
			}
		}
	}()
}

// pollDisk reads the free space, updates the guard and the log-failure
// watch (logwatch.go).
func (g *diskGuard) pollDisk() {
	free := g.readFree()
	threshold := g.minFreeDisk()
	g.threshold.Store(threshold)
	low := threshold > 0 && free >= 0 && free < threshold
	if was := g.low.Swap(low); was != low {
		if low {
			g.log.Warn("free disk space is below --min-free-disk: as leader, this server refuses acquires and new sessions "+
				"until space is freed (renewals, heartbeats, releases and revokes go on)",
				"dir", g.cfg.DataDir, "free_bytes", free, "min_free_bytes", threshold)
		} else {
			g.log.Info("free disk space is above --min-free-disk again", "dir", g.cfg.DataDir,
				"free_bytes", free, "min_free_bytes", threshold)
		}
	}
	g.updatePeersLow()
	g.updateRefusal()
	g.logs.check(g.log, g.cfg.logFailureTimeout(), free, g.cfg.restartFreeDisk())
}

// readFree reads this server's free space and records it.
func (g *diskGuard) readFree() int64 {
	statfs := statfsFree
	if g.cfg.diskFree != nil {
		statfs = g.cfg.diskFree
	}
	free, err := statfs(g.cfg.DataDir)
	if err != nil {
		g.log.Warn("free-space guard: statfs of the data directory failed", "dir", g.cfg.DataDir, "err", err)
		free = -1
	}
	g.free.Store(free)
	g.readAt.Store(monoNow().UnixNano())
	return free
}

// recheck reads this server's free space again when the reading is older
// than diskRecheck and it crossed below the threshold meanwhile, then
// updates the refusal (one caller at a time reads; the others go on with
// the reading they have). Rising above the threshold waits for the poll,
// which also logs it.
func (g *diskGuard) recheck() {
	at := g.readAt.Load()
	threshold := g.threshold.Load()
	if threshold <= 0 || g.low.Load() || monoNow().UnixNano()-at < int64(diskRecheck) ||
		!g.readAt.CompareAndSwap(at, monoNow().UnixNano()) {
		return
	}
	if free := g.readFree(); free >= 0 && free < threshold && !g.low.Swap(true) {
		g.log.Warn("free disk space is below --min-free-disk: as leader, this server refuses acquires and new sessions "+
			"until space is freed (renewals, heartbeats, releases and revokes go on)",
			"dir", g.cfg.DataDir, "free_bytes", free, "min_free_bytes", threshold)
		g.updateRefusal()
	}
}

// updatePeersLow records which voters gossip reports low, as the leader
// sees them.
func (g *diskGuard) updatePeersLow() {
	empty := ""
	r := g.clP.Load()
	if r == nil || !r.IsLeader() || g.mem == nil || g.mem.Gossip() == nil {
		g.peersLow.Store(&empty)
		return
	}
	conf, err := r.Configuration()
	if err != nil {
		return
	}
	desc := ""
	for _, s := range conf.Servers {
		if !s.Voter || s.ID == g.cfg.NodeID {
			continue
		}
		p, ok := g.mem.Gossip().Peer(s.ID)
		if !ok || p.Stats == nil || !p.Stats.DiskLow || time.Since(p.StatsAt) > peerDiskFresh {
			continue
		}
		if desc != "" {
			desc += ", "
		}
		desc += fmt.Sprintf("%s (%s free)", s.ID, fmtBytes(p.Stats.DiskFree))
	}
	g.peersLow.Store(&desc)
}

// updateRefusal sets the error growing writes get now.
func (g *diskGuard) updateRefusal() {
	threshold := g.threshold.Load()
	var e *wire.Error
	switch peers := g.peersLow.Load(); {
	case g.low.Load():
		e = fsm.Exhausted("min_free_disk", uint64(threshold),
			"free disk space is low: the data directory of server %s has %s free, below --min-free-disk (%s); "+
				"acquires and new sessions are refused until space is freed (renewals, heartbeats, releases and revokes still work)",
			g.cfg.NodeID, fmtBytes(g.free.Load()), fmtBytes(threshold))
	case peers != nil && *peers != "":
		e = fsm.Exhausted("min_free_disk", uint64(threshold),
			"free disk space is low on %s, below its --min-free-disk; acquires and new sessions are refused until space is freed "+
				"(renewals, heartbeats, releases and revokes still work)", *peers)
	}
	g.refusal.Store(e)
}

// growthRefused is the error an acquire or a session create gets before
// it is proposed while the guard holds (only where this server leads:
// a follower's request reaches the leader, which decides), or nil.
func (g *diskGuard) growthRefused() error {
	if g.diskOn() {
		g.recheck()
	}
	e := g.refusal.Load()
	if e == nil || !g.rep.leading() {
		return nil
	}
	c := *e
	return &c
}

func (g *diskGuard) registerDiskMetrics() {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	g.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_disk_free_bytes",
			Help: "Free bytes (available to the server) on the filesystem of the data directory, read every second; -1 when unknown or in memory.",
		}, func() float64 { return float64(g.free.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_disk_min_free_bytes",
			Help: "The free-space guard's threshold (--min-free-disk, or its default max(256 MiB, 2x the latest snapshot)); 0 when off.",
		}, func() float64 { return float64(g.threshold.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_disk_low",
			Help: "1 while this server's free disk space is below its threshold.",
		}, func() float64 { return b2f(g.low.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_writes_refused_disk",
			Help: "1 while this server, as leader, refuses acquires and new sessions because it or a voter is low on disk space.",
		}, func() float64 { return b2f(g.refusal.Load() != nil && g.rep.leading()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_log_store_failing",
			Help: "1 while Raft's log store fails every write (a full or broken disk); /healthz fails meanwhile.",
		}, func() float64 { return b2f(g.logs.failingSince.Load() != 0) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leasehold_log_store_write_failures_total",
			Help: "Writes to Raft's log store that failed.",
		}, func() float64 { return float64(g.logs.failures.Load()) }),
	)
}
