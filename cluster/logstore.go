package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// walDir is the directory, inside the data dir, of Raft's log: segment
// files (raft-wal) and their metadata (wal-meta.db). raft.db stays Raft's
// stable store (current term, vote) and holds the data dir's lock.
const walDir = "wal"

// migrateBatchBytes is about how much log data one append of a migration
// carries.
const migrateBatchBytes = 4 << 20

// openLogStore opens the Raft log in dir/wal. An append to it is one
// write and one fsync (bbolt's commit is two of each). bolt must already
// be open: its file lock keeps a second server off the whole data dir.
//
// Log entries a previous version stored in raft.db move to the new log:
// copied (each batch fsynced), then deleted from raft.db. A crash in
// between repeats or finishes the move on the next open: entries already
// copied are not copied again, and raft.db's are deleted only once the new
// log holds them all. snapIndex is the index of the latest snapshot (0:
// none), which may cover a gap in raft.db's log (migrateLogs).
func openLogStore(dir string, bolt *raftboltdb.BoltStore, snapIndex uint64, logger *slog.Logger) (*walStore, error) {
	path := filepath.Join(dir, walDir)
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: log dir: %w", err)
	}
	meta := &metadb.BoltMetaDB{}
	wal, err := raftwal.Open(path, raftwal.WithMetaStore(meta), raftwal.WithLogger(newHCLogger("wal", logger)))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open the raft log in %s: %w", path, err)
	}
	s := &walStore{WAL: wal, meta: meta}
	if err := migrateLogs(s, bolt, snapIndex, logger); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// walStore is the raft-wal log and its metadata store. WAL.Close closes
// the metadata store too since raft-wal v0.4.2; Close closes it again
// (a no-op then) so that a failed open, which has no WAL, still closes it.
//
// v0.4.2 is needed, not only preferred: v0.4.0 marked a segment sealed on a
// tail truncation without writing its index block, and a server restarted
// after one could not read its log (TestLogReopensAfterTailTruncation).
type walStore struct {
	*raftwal.WAL
	meta *metadb.BoltMetaDB
}

// storeLogsMetric is the go-metrics key of a log append's time (write and
// fsync). It keeps raft-boltdb's name, which the dashboards, the slow-fsync
// alert (deploy/) and docs/monitoring.md use as leasehold_raft_boltdb_storeLogs.
var storeLogsMetric = []string{"raft", "boltdb", "storeLogs"}

// StoreLogs appends logs (one write, one fsync) and reports the time taken
// as storeLogsMetric.
func (s *walStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	if err := s.WAL.StoreLogs(logs); err != nil {
		return err
	}
	metrics.MeasureSince(storeLogsMetric, start)
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

// migrateLogs moves the log entries in src (raft.db of a previous
// version) to the end of dst, then deletes them from src. Entries dst
// already holds (a move cut short by a crash) are not copied again.
//
// raft.db's log may have a gap: the earlier version left one where a
// follower installed a snapshot, and where a backup was restored (Raft
// skips an index then). Entries before the last gap are not moved when the
// latest snapshot (at snapIndex) covers the gap; a gap no snapshot covers
// is refused.
func migrateLogs(dst, src raft.LogStore, snapIndex uint64, logger *slog.Logger) error {
	first, err := src.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: raft.db's first log index: %w", err)
	}
	last, err := src.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: raft.db's last log index: %w", err)
	}
	if last == 0 {
		return nil
	}
	if snapIndex >= last {
		// The latest snapshot covers every entry (a follower that
		// installed one stopped before appending after it): none moves.
		// Moved, they would end the new log below the snapshot, and
		// raft-wal takes only the next index, not the snapshot's next.
		if dstLast, err := dst.LastIndex(); err != nil || dstLast != 0 {
			return fmt.Errorf("cluster: the latest snapshot (index %d) covers raft.db's log entries %d-%d, but the raft log is not empty (last index %d, %v): refusing to start", snapIndex, first, last, dstLast, err)
		}
		logger.Info("raft.db's log is covered by the latest snapshot: dropping it", "first", first, "last", last, "snapshot_index", snapIndex)
		if err := src.DeleteRange(first, last); err != nil {
			return fmt.Errorf("cluster: delete the log entries the snapshot covers from raft.db: %w", err)
		}
		return nil
	}
	start, err := unbrokenFrom(src, first, last)
	if err != nil {
		return err
	}
	if start > first {
		if start-1 > snapIndex {
			return fmt.Errorf("cluster: raft.db's log has no entry %d and the latest snapshot (index %d) does not cover it: refusing to move the log", start-1, snapIndex)
		}
		logger.Info("raft.db's log has a gap a snapshot covers: moving the entries after it", "gap_before", start, "snapshot_index", snapIndex)
	}
	dstFirst, err := dst.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: the raft log's first index: %w", err)
	}
	dstLast, err := dst.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: the raft log's last index: %w", err)
	}
	from := start
	if dstLast > 0 {
		// A move cut short: dst must hold a prefix of the entries to
		// move, or all of them, and end with the same entry as raft.db
		// at that index (a log from another history is refused).
		if dstFirst != start || dstLast > last || !sameEntry(dst, src, dstLast) {
			return fmt.Errorf("cluster: raft.db holds log entries %d-%d and the raft log %d-%d, which does not continue into it: refusing to merge them", start, last, dstFirst, dstLast)
		}
		from = dstLast + 1
	}
	if from <= last {
		logger.Info("moving the raft log out of raft.db", "first", from, "last", last)
		if err := copyLogs(dst, src, from, last); err != nil {
			return err
		}
	}
	if err := src.DeleteRange(first, last); err != nil {
		return fmt.Errorf("cluster: delete the moved log entries from raft.db: %w", err)
	}
	return nil
}

// unbrokenFrom returns the first index of the unbroken run of src's
// entries that ends at last.
func unbrokenFrom(src raft.LogStore, first, last uint64) (uint64, error) {
	var l raft.Log
	for i := last; i > first; i-- {
		err := src.GetLog(i-1, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			return i, nil
		}
		if err != nil {
			return 0, fmt.Errorf("cluster: read log entry %d from raft.db: %w", i-1, err)
		}
	}
	return first, nil
}

// sameEntry reports whether a and b both hold entry i, of the same term.
func sameEntry(a, b raft.LogStore, i uint64) bool {
	var la, lb raft.Log
	return a.GetLog(i, &la) == nil && b.GetLog(i, &lb) == nil && la.Term == lb.Term
}

// copyLogs appends src's entries from..last to dst in batches of about
// migrateBatchBytes.
func copyLogs(dst, src raft.LogStore, from, last uint64) error {
	var batch []*raft.Log
	size := 0
	for i := from; i <= last; i++ {
		l := new(raft.Log)
		if err := src.GetLog(i, l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				return fmt.Errorf("cluster: raft.db has no log entry %d (between %d and %d)", i, from, last)
			}
			return fmt.Errorf("cluster: read log entry %d from raft.db: %w", i, err)
		}
		batch = append(batch, l)
		size += len(l.Data) + len(l.Extensions) + 32
		if size >= migrateBatchBytes || i == last {
			if err := dst.StoreLogs(batch); err != nil {
				return fmt.Errorf("cluster: copy log entries %d-%d from raft.db: %w", batch[0].Index, i, err)
			}
			batch, size = batch[:0], 0
		}
	}
	return nil
}

// monotonicLogs tells Raft that the log cannot hold a gap (raft-wal
// refuses one): after installing a snapshot Raft then empties the log
// rather than leaving entries before the gap. Wrappers of the log store
// (WrapStores, raft.LogCache) need not pass the method on.
type monotonicLogs struct{ raft.LogStore }

// IsMonotonic implements raft.MonotonicLogStore.
func (monotonicLogs) IsMonotonic() bool { return true }
