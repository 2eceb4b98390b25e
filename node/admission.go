package node

import (
	"fmt"
	"runtime/metrics"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// Admission control of a restore. Every server applies a restore's commit
// at the same index, so a restore that one server cannot hold (memory,
// disk) is not one server's failure but the whole cluster's: each
// replica runs out at the same entry, and again after each restart. The
// leader therefore refuses a restore up front (UNAVAILABLE, 503, with the
// reason; nothing changed) unless every voter has the room it needs,
// judged from the file's header before the body is read:
//
//   - disk: the chunks in the log, up to two Raft snapshots taken while
//     the restore is staged (each carries the staged bytes) and the first
//     snapshot of the restored state: restoreDiskFactor times the body,
//     above the server's free-space threshold (--min-free-disk); the
//     leader also spools the body once. Voters report their free space
//     through gossip; one that has not reported within peerDiskFresh is
//     not known to have room.
//   - memory: the commit holds, at once, the running state, the staged
//     body, the decoded file, the rebase's maps and the state it builds
//     (restoreMemory); the estimate must fit every voter's limit (its
//     Config.MemoryLimit, gossiped).

// restoreDiskFactor is how many times a restore's body a server's disk
// must have free for it: the log's chunks, two snapshots that carry the
// staged chunks, and the restored state's first snapshot.
const restoreDiskFactor = 4

// Heap estimates per record, for restoreMemory: a million active leases
// (a key each) take about 450 MiB of heap (docs/operations.md, Memory).
const (
	heapPerLease   = 400
	heapPerKey     = 80
	heapPerSession = 320
	// heapPerRebase is what the rebase's maps and sorted lists hold per
	// record of either state.
	heapPerRebase = 96
)

// stateHeap is the heap estimate of a state with counts c.
func stateHeap(c fsm.SnapshotCounts) int64 {
	return int64(c.Leases)*heapPerLease + int64(c.Keys)*heapPerKey + int64(c.Sessions)*heapPerSession
}

// restoreMemory estimates the heap a server needs at a restore's commit:
// what it holds now (live, or the running state's estimate when that is
// more), the staged body (size bytes), the decoded file, the state the
// rebase builds (at most both states' records) and the rebase's maps.
func restoreMemory(live int64, cur, file fsm.SnapshotCounts, size int64) int64 {
	curHeap, fileHeap := stateHeap(cur), stateHeap(file)
	records := int64(cur.Leases + cur.Sessions + file.Leases + file.Sessions)
	return max(live, curHeap) + size + fileHeap + (curHeap + fileHeap) + records*heapPerRebase
}

// countsFromSize guesses the counts of a snapshot whose header could not
// be read before decoding (format 1: JSON lines of at least 64 bytes).
func countsFromSize(size int64) fsm.SnapshotCounts {
	n := int(size / 64)
	return fsm.SnapshotCounts{Leases: n, Keys: n, Sessions: n / 8}
}

// memLimit is the memory this server holds a restore's estimate to
// (Config.MemoryLimit, else the machine's physical memory); 0: none.
func (bk *backups) memLimit() int64 {
	switch l := bk.cfg.MemoryLimit; {
	case l < 0:
		return 0
	case l > 0:
		return l
	}
	return physicalMemory()
}

// liveHeap is the Go heap's live bytes after the last collection (0 when
// the runtime does not say).
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// admitRestore refuses a restore of a body of size bytes with the counts
// file (ok: read from its header) unless every voter has the disk and
// memory it needs; it describes what it checked in a log line either way.
func (bk *backups) admitRestore(size int64, file fsm.SnapshotCounts, ok bool) error {
	start := time.Now()
	if !ok {
		file = countsFromSize(size)
	}
	n := bk
	n.rep.mu.RLock()
	cur := n.rep.f.Records()
	n.rep.mu.RUnlock()
	need := restoreMemory(liveHeap(), cur, file, size)
	conf, err := n.cl.Configuration()
	if err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "restore: read the configuration: " + err.Error()}
	}
	threshold := max(n.disk.threshold.Load(), 0)
	diskNeed := restoreDiskFactor*size + threshold
	refuse := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		n.log.Warn("restore refused by its admission check", "reason", msg, "size", size, "file_leases", file.Leases,
			"cluster_leases", cur.Leases, "memory_estimate", need, "took", time.Since(start))
		return &wire.Error{Code: wire.CodeUnavailable, Message: "restore refused: " + msg + "; nothing changed (see docs/operations.md, Backup and restore: sizing)"}
	}
	for _, s := range conf.Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		id := string(s.ID)
		var free, limit int64
		if id == n.cfg.NodeID {
			if n.disk.diskOn() {
				free = n.disk.readFree()
				if free < 0 {
					return refuse("the free disk space of server %s (this one) cannot be read", id)
				}
				diskNeed := diskNeed + size // the spool
				if free < diskNeed {
					return refuse("server %s (this one) has %s of disk free; the restore needs %s (%dx the file's %s, the spool, and --min-free-disk %s)",
						id, fmtBytes(free), fmtBytes(diskNeed), restoreDiskFactor, fmtBytes(size), fmtBytes(threshold))
				}
			}
			limit = bk.memLimit()
		} else {
			p, found := cluster.Peer{}, false
			if n.mem != nil && n.mem.gossip != nil {
				p, found = n.mem.gossip.Peer(id)
			}
			if !found || p.Stats == nil || time.Since(p.StatsAt) > peerDiskFresh {
				return refuse("server %s has not reported its free disk space and memory through gossip within %s; retry shortly", id, peerDiskFresh)
			}
			// A server that watches no disk (in memory) reports 0 free
			// and is not low.
			if free = p.Stats.DiskFree; (free > 0 || p.Stats.DiskLow) && free < diskNeed {
				return refuse("server %s has %s of disk free; the restore needs %s (%dx the file's %s and --min-free-disk %s)",
					id, fmtBytes(free), fmtBytes(diskNeed), restoreDiskFactor, fmtBytes(size), fmtBytes(threshold))
			}
			limit = p.Stats.MemLimit
		}
		if limit > 0 && need > limit {
			return refuse("server %s may use %s of memory; applying the restore needs about %s (the running state of %d leases, "+
				"the file of %s with %d leases decoded, and the state the restore builds)",
				id, fmtBytes(limit), fmtBytes(need), cur.Leases, fmtBytes(size), file.Leases)
		}
	}
	n.log.Info("restore admitted", "size", size, "file_leases", file.Leases, "cluster_leases", cur.Leases,
		"memory_estimate", need, "disk_need", diskNeed, "took", time.Since(start))
	return nil
}
