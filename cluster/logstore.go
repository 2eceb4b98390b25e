package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
)

// walDir is the directory, inside the data dir, of Raft's log when it is
// kept by raft-wal: segment files and their metadata (wal-meta.db).
// raft.db stays Raft's stable store (current term, vote) and holds the
// data dir's lock either way.
const walDir = "wal"

// The Raft log stores a data dir can use (Config.LogStore, the server's
// --raft-log).
const (
	// LogStoreBoltDB keeps the log in raft.db (bbolt, raft-boltdb's
	// layout): the log of every release up to edecda9. An append is one
	// bbolt transaction (two writes and two fsyncs).
	LogStoreBoltDB = "boltdb"
	// LogStoreWAL keeps the log in wal/ (hashicorp/raft-wal, which its
	// authors still call experimental): an append is one write and one
	// fsync to a preallocated segment file.
	LogStoreWAL = "wal"
)

// DefaultLogStore is the log store of a new data dir when Config.LogStore
// is empty. It is the store that passes the whole durability suite
// (TestLogStoreDurability): raft-wal wedges after ENOSPC at a segment
// rotation (every later append fails with "segment is sealed" until a
// restart) and boltdb does not.
const DefaultLogStore = LogStoreBoltDB

// migrateBatchBytes is about how much log data one append of a migration
// carries.
const migrateBatchBytes = 4 << 20

// walSegmentSize is raft-wal's segment size (tests lower it to rotate
// segments often); 0 is raft-wal's default, 64 MiB.
var walSegmentSize = 0

// The bounds of Config.WALSegmentSize when it is not 0.
const (
	MinWALSegmentSize = 1 << 20
	MaxWALSegmentSize = 1 << 30
)

// openWAL opens the Raft log in dir/wal, creating it if need be, with
// walSegmentSize. An append to it is one write and one fsync. raft.db must
// already be open: its file lock keeps a second server off the whole data
// dir.
func openWAL(dir string, logger *slog.Logger) (*walStore, error) {
	return openWALSegments(dir, walSegmentSize, logger)
}

// openWALSegments is openWAL with new segments of segmentSize bytes (0:
// raft-wal's default).
func openWALSegments(dir string, segmentSize int, logger *slog.Logger) (*walStore, error) {
	path := filepath.Join(dir, walDir)
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: log dir: %w", err)
	}
	meta := &metadb.BoltMetaDB{}
	var (
		wal *raftwal.WAL
		err error
	)
	collector := walmetrics.NewGoMetricsCollector([]string{"raft", "wal"}, nil, nil)
	if segmentSize > 0 {
		wal, err = raftwal.Open(path, raftwal.WithMetaStore(meta), raftwal.WithLogger(newHCLogger("wal", logger)),
			raftwal.WithMetricsCollector(collector), raftwal.WithSegmentSize(segmentSize))
	} else {
		wal, err = raftwal.Open(path, raftwal.WithMetaStore(meta), raftwal.WithLogger(newHCLogger("wal", logger)),
			raftwal.WithMetricsCollector(collector))
	}
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open the raft log in %s: %w", path, err)
	}
	return &walStore{WAL: wal, meta: meta}, nil
}

// walStore is the raft-wal log and its metadata store. WAL.Close closes
// the metadata store too since raft-wal v0.4.2; Close closes it again
// (a no-op then) so that a failed open, which has no WAL, still closes it.
// v0.4.2 is required: v0.4.0 left a log unreadable after a tail truncation.
type walStore struct {
	*raftwal.WAL
	meta *metadb.BoltMetaDB
}

// The go-metrics keys of a log append's time (write and fsync), one per
// log store: leasehold_raft_boltdb_storeLogs (raft-boltdb's name, which
// the releases that kept the log in raft.db reported) and
// leasehold_raft_wal_storeLogs. The slow-fsync alert (deploy/) and the
// dashboard read both.
var (
	boltStoreLogsMetric = []string{"raft", "boltdb", "storeLogs"}
	walStoreLogsMetric  = []string{"raft", "wal", "storeLogs"}
)

// StoreLogs appends logs (one write, one fsync) and reports the time taken
// as walStoreLogsMetric.
func (s *walStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	if err := s.WAL.StoreLogs(logs); err != nil {
		return err
	}
	metrics.MeasureSince(walStoreLogsMetric, start)
	return nil
}

// StoreLog appends one entry (see StoreLogs).
func (s *walStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// GetLog reads entry idx. Entries outside FirstIndex..LastIndex are not
// found, as Raft expects once DeleteRange removed them: raft-wal keeps
// reading entries a head truncation removed until their segment file goes,
// and a leader would then send a lagging follower those entries instead of
// its snapshot.
func (s *walStore) GetLog(idx uint64, l *raft.Log) error {
	first, err := s.FirstIndex()
	if err != nil {
		return err
	}
	last, err := s.LastIndex()
	if err != nil {
		return err
	}
	if idx < first || idx > last {
		return raft.ErrLogNotFound
	}
	return s.WAL.GetLog(idx, l)
}

// Close closes the log, then its metadata store.
func (s *walStore) Close() error {
	err := s.WAL.Close()
	if merr := s.meta.Close(); err == nil {
		err = merr
	}
	return err
}

// logSource is a log a move reads: raft.db's (boltStore's view, which
// never shows the format guard) or wal/'s.
type logSource interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	GetLog(index uint64, log *raft.Log) error
}

// migrateLogs moves the log entries in src (named from in errors and
// logs) to the end of dst, then has drop retire src's entries first..last
// (first and last are 0 when src is empty: drop must still run, it
// records the move). Entries dst already holds (a move cut short by a
// crash) are not copied again.
//
// A log in raft.db may have a gap: releases before the format check left
// one where a follower installed a snapshot, and where a backup was
// restored (Raft skips an index then). Entries before the last gap are not
// moved when the latest snapshot (at snapIndex) covers the gap; a gap no
// snapshot covers is refused. dst is raft-wal (which takes no gap) or
// raft.db.
func migrateLogs(dst raft.LogStore, src logSource, from string, snapIndex uint64, logger *slog.Logger, drop func(first, last uint64) error) error {
	first, err := src.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: %s's first log index: %w", from, err)
	}
	last, err := src.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: %s's last log index: %w", from, err)
	}
	if last == 0 {
		if dstLast, err := dst.LastIndex(); err != nil || dstLast != 0 {
			return fmt.Errorf("cluster: %s's log is empty but the log it moves to is not (last index %d, %v): refusing to move", from, dstLast, err)
		}
		return drop(0, 0)
	}
	if snapIndex >= last {
		// The latest snapshot covers every entry (a follower that
		// installed one stopped before appending after it): none moves.
		// Moved, they would end the new log below the snapshot, and
		// raft-wal takes only the next index, not the snapshot's next.
		if dstLast, err := dst.LastIndex(); err != nil || dstLast != 0 {
			return fmt.Errorf("cluster: the latest snapshot (index %d) covers %s's log entries %d-%d, but the log they would move to is not empty (last index %d, %v): refusing to move", snapIndex, from, first, last, dstLast, err)
		}
		logger.Info("the log is covered by the latest snapshot: dropping it", "from", from, "first", first, "last", last, "snapshot_index", snapIndex)
		if err := drop(first, last); err != nil {
			return fmt.Errorf("cluster: drop the log entries the snapshot covers from %s: %w", from, err)
		}
		return nil
	}
	start, err := unbrokenFrom(src, from, first, last)
	if err != nil {
		return err
	}
	if start > first {
		if start-1 > snapIndex {
			return fmt.Errorf("cluster: %s's log has no entry %d and the latest snapshot (index %d) does not cover it: refusing to move the log", from, start-1, snapIndex)
		}
		logger.Info("the log has a gap a snapshot covers: moving the entries after it", "from", from, "gap_before", start, "snapshot_index", snapIndex)
	}
	dstFirst, err := dst.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: the new log's first index: %w", err)
	}
	dstLast, err := dst.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: the new log's last index: %w", err)
	}
	next := start
	if dstLast > 0 {
		// A move cut short: dst must hold a prefix of the entries to
		// move, or all of them, and end with the same entry as src at
		// that index (a log from another history is refused).
		if dstFirst != start || dstLast > last || !sameEntry(dst, src, dstLast) {
			return fmt.Errorf("cluster: %s holds log entries %d-%d and the new log %d-%d, which does not continue into it: refusing to merge them", from, start, last, dstFirst, dstLast)
		}
		next = dstLast + 1
	}
	if next <= last {
		logger.Info("moving the raft log", "from", from, "first", next, "last", last)
		if err := copyLogs(dst, src, from, next, last); err != nil {
			return err
		}
	}
	if err := drop(first, last); err != nil {
		return fmt.Errorf("cluster: retire the moved log entries of %s: %w", from, err)
	}
	return nil
}

// unbrokenFrom returns the first index of the unbroken run of src's
// entries that ends at last.
func unbrokenFrom(src logSource, from string, first, last uint64) (uint64, error) {
	var l raft.Log
	for i := last; i > first; i-- {
		err := src.GetLog(i-1, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			return i, nil
		}
		if err != nil {
			return 0, fmt.Errorf("cluster: read log entry %d from %s: %w", i-1, from, err)
		}
	}
	return first, nil
}

// sameEntry reports whether a and b both hold entry i, of the same term.
func sameEntry(a, b logSource, i uint64) bool {
	var la, lb raft.Log
	return a.GetLog(i, &la) == nil && b.GetLog(i, &lb) == nil && la.Term == lb.Term
}

// copyLogs appends src's entries next..last to dst in batches of about
// migrateBatchBytes.
func copyLogs(dst raft.LogStore, src logSource, from string, next, last uint64) error {
	var batch []*raft.Log
	size := 0
	for i := next; i <= last; i++ {
		l := new(raft.Log)
		if err := src.GetLog(i, l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				return fmt.Errorf("cluster: %s has no log entry %d (between %d and %d)", from, i, next, last)
			}
			return fmt.Errorf("cluster: read log entry %d from %s: %w", i, from, err)
		}
		batch = append(batch, l)
		size += len(l.Data) + len(l.Extensions) + 32
		if size >= migrateBatchBytes || i == last {
			if err := dst.StoreLogs(batch); err != nil {
				return fmt.Errorf("cluster: copy log entries %d-%d from %s: %w", batch[0].Index, i, from, err)
			}
			batch, size = batch[:0], 0
		}
	}
	return nil
}

// gaplessLogs keeps the log free of gaps (raft-wal refuses one) without
// telling Raft the log is monotonic. Raft's monotonic path is broken
// (hashicorp/raft#697: after installing a snapshot older than its log, the
// next commit panics with "log not found"). So Raft takes its ordinary path
// (keep the entries above the snapshot, compact the rest), and the one
// append that would leave a gap, the first after a snapshot newer than the
// whole log, empties the log before it stores. Wrappers of the log store
// (WrapStores, raft.LogCache) sit inside this one.
type gaplessLogs struct {
	raft.LogStore
	mu sync.Mutex // a gap check and the emptying it leads to are one step
	// last is the log's last index as this wrapper's own appends left it
	// (lastOK), so that an append does not read it back from the store
	// (with raft.db a read transaction per append). Any DeleteRange or
	// failed append forgets it: the next append asks the store.
	last   uint64
	lastOK bool
}

// StoreLog implements raft.LogStore.
func (g *gaplessLogs) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: entries that do not follow the last
// one (a snapshot newer than the whole log was installed) replace the log.
func (g *gaplessLogs) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	last := g.last
	if !g.lastOK {
		var err error
		if last, err = g.LogStore.LastIndex(); err != nil {
			return err
		}
	}
	g.lastOK = false
	if last > 0 && logs[0].Index > last+1 {
		first, err := g.LogStore.FirstIndex()
		if err != nil {
			return err
		}
		if err := g.LogStore.DeleteRange(first, last); err != nil {
			return fmt.Errorf("cluster: empty the log (entries %d-%d) before appending %d past a snapshot: %w",
				first, last, logs[0].Index, err)
		}
		last = 0
	}
	if err := g.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	g.last, g.lastOK = max(last, logs[len(logs)-1].Index), true
	return nil
}

// DeleteRange implements raft.LogStore.
func (g *gaplessLogs) DeleteRange(lo, hi uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastOK = false
	return g.LogStore.DeleteRange(lo, hi)
}
