package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// dirLog is what a data dir's log store is, as detectLogStore finds it.
type dirLog struct {
	// kind is LogStoreBoltDB or LogStoreWAL; "" for a new directory.
	kind string
	// recorded: raft.db names kind (logStoreKey).
	recorded bool
}

// walPresent tells whether dir holds a raft-wal log (its metadata file).
func walPresent(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, walDir, "wal-meta.db"))
	return err == nil
}

// detectLogStore finds which log store the data dir (dir, raft.db open as
// b, of data format format) keeps its log in:
//
//   - the store raft.db names (logStoreKey), recorded by this release
//     when it first opened the directory and by "leasehold data
//     migrate-log";
//   - else, format 2 (the releases before the record): wal/;
//   - else (format 1): raft.db, when it holds a log or the directory has
//     Raft state; wal/, when only it holds a log (a directory a release of
//     format 2 created and a crash stopped before it recorded the format);
//     none, a new directory.
//
// It refuses a directory whose other store holds a log too (a move cut
// short), naming the command that finishes it.
func detectLogStore(dir string, b *boltStore, format uint64) (dirLog, error) {
	rec, err := b.logStore()
	if err != nil {
		return dirLog{}, fmt.Errorf("cluster: read the log store of %s: %w", dir, err)
	}
	boltLast, err := b.LastIndex()
	if err != nil {
		return dirLog{}, fmt.Errorf("cluster: read raft.db's log: %w", err)
	}
	wal := walPresent(dir)
	d := dirLog{kind: rec, recorded: rec != ""}
	switch {
	case rec != "":
	case format >= 2:
		d.kind = LogStoreWAL
	case boltLast > 0:
		d.kind = LogStoreBoltDB
	case wal:
		d.kind = LogStoreWAL
	default:
		has, err := hasRaftState(dir, b)
		if err != nil {
			return dirLog{}, err
		}
		if has {
			d.kind = LogStoreBoltDB
		}
	}
	switch {
	case d.kind == LogStoreBoltDB && wal:
		return d, fmt.Errorf("cluster: data dir %s keeps its raft log in raft.db (%s), but %s holds a raft-wal log too: "+
			"a log move was cut short. With the server stopped, finish it with 'leasehold data migrate-log --data-dir %s --to %s' "+
			"(or --to %s to keep raft.db's log; both keep a backup)",
			dir, LogStoreBoltDB, filepath.Join(dir, walDir), dir, LogStoreWAL, LogStoreBoltDB)
	case d.kind == LogStoreWAL && boltLast > 0:
		boltFirst, _ := b.FirstIndex()
		return d, fmt.Errorf("cluster: data dir %s keeps its raft log in %s (%s), but raft.db holds log entries %d-%d too: "+
			"a log move was cut short. With the server stopped, finish it with 'leasehold data migrate-log --data-dir %s --to %s' "+
			"(or --to %s to keep wal/'s log; both keep a backup)",
			dir, filepath.Join(dir, walDir), LogStoreWAL, boltFirst, boltLast, dir, LogStoreBoltDB, LogStoreWAL)
	}
	return d, nil
}

// hasRaftState tells whether dir has Raft state besides a log: a term in
// raft.db or a snapshot.
func hasRaftState(dir string, b *boltStore) (bool, error) {
	if _, err := b.Get([]byte("CurrentTerm")); err == nil {
		return true, nil
	} else if !errors.Is(err, errKeyNotFound) {
		return false, err
	}
	snaps, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	return len(snaps) > 0, nil
}

// checkLogStore validates a log store's name: "" is allowed when empty is.
func checkLogStore(kind string, empty bool) error {
	switch kind {
	case LogStoreBoltDB, LogStoreWAL:
		return nil
	case "":
		if empty {
			return nil
		}
	}
	return fmt.Errorf("%w: raft log store %q: want %s or %s", ErrInvalidConfig, kind, LogStoreBoltDB, LogStoreWAL)
}

// openLogs opens the data dir's log (dir, raft.db open as bolt, of data
// format format): in the store the directory keeps it in, or, for a new
// directory, in want (DefaultLogStore when empty). A want that is not the
// directory's store is refused with both named: the log moves only
// offline (MigrateLog). It records the format and the store when raft.db
// does not yet. A raft-wal log makes new segments of walSegment bytes (0:
// walSegmentSize).
func openLogs(dir string, bolt *boltStore, format uint64, want string, walSegment int, logger *slog.Logger) (raft.LogStore, io.Closer, error) {
	if err := checkLogStore(want, true); err != nil {
		return nil, nil, err
	}
	d, err := detectLogStore(dir, bolt, format)
	if err != nil {
		return nil, nil, err
	}
	kind := d.kind
	switch {
	case kind == "" && want == "":
		kind = DefaultLogStore
	case kind == "":
		kind = want
	case want != "" && want != kind:
		return nil, nil, fmt.Errorf("%w: --raft-log %s, but data dir %s keeps its raft log in %s (%s); "+
			"an existing directory keeps its log store: start without --raft-log or with --raft-log %s, "+
			"or move the log with the server stopped: 'leasehold data migrate-log --data-dir %s --to %s' (see docs/operations.md)",
			ErrInvalidConfig, want, dir, logLocation(kind), kind, kind, dir, want)
	}
	var (
		logs   raft.LogStore
		closer io.Closer
	)
	if kind == LogStoreWAL {
		w, err := openWALSegments(dir, cmp.Or(walSegment, walSegmentSize), logger)
		if err != nil {
			return nil, nil, err
		}
		logs, closer = w, w
	} else {
		logs, closer = bolt, nopCloser{}
	}
	if format < DataFormat || !d.recorded {
		// Before Raft writes to the log.
		if err := bolt.upgrade(kind, 0, 0); err != nil {
			closer.Close()
			return nil, nil, fmt.Errorf("cluster: record data format %d and log store %s in raft.db: %w", DataFormat, kind, err)
		}
		if format < DataFormat && d.kind != "" {
			logger.Info("data dir upgraded", "dir", dir, "from_format", format, "to_format", DataFormat, "raft_log", kind)
		}
	}
	logger.Info("raft log", "store", kind, "where", logLocation(kind), "new_dir", d.kind == "")
	return logs, closer, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// logLocation is where a log store keeps the log, for messages.
func logLocation(kind string) string {
	if kind == LogStoreWAL {
		return walDir + "/"
	}
	return "raft.db"
}

// latestSnapshotIndex is the index of the newest snapshot of snaps that
// opens (the one Raft restores: it skips those that do not); 0: none.
func latestSnapshotIndex(snaps *raft.FileSnapshotStore) uint64 {
	metas, _ := snaps.List()
	for _, m := range metas {
		if _, rc, err := snaps.Open(m.ID); err == nil {
			rc.Close()
			return m.Index
		}
	}
	return 0
}

// MigrateResult is what MigrateLog did.
type MigrateResult struct {
	// From and To are the log stores before and after.
	From, To string
	// Backup is the directory holding the backup (empty when nothing
	// changed): raft.db as it was before the move and, after a move out
	// of raft-wal, the wal/ directory itself.
	Backup string
	// First and Last are the entries the log held (0, 0: none).
	First, Last uint64
}

// MigrateLog moves the Raft log of the data dir dir to the log store to,
// offline: it refuses while a server runs on the directory (raft.db's
// lock), and refuses a directory of a newer data format. Before it changes
// anything it copies raft.db into a new directory dir/log-backup-<UTC
// time>; a move out of raft-wal then moves wal/ there once its entries are
// in raft.db. A move cut short (a crash, a full disk) leaves a directory
// that the server refuses and that MigrateLog finishes when run again.
func MigrateLog(dir, to string, logger *slog.Logger) (MigrateResult, error) {
	res := MigrateResult{To: to}
	if err := checkLogStore(to, false); err != nil {
		return res, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bolt, format, err := openStopped(dir, " (the log moves only offline)")
	if err != nil {
		return res, err
	}
	defer bolt.Close()
	d, derr := detectLogStore(dir, bolt, format)
	res.From = d.kind
	if derr == nil && d.kind == to {
		first, last, _ := logBounds(dir, bolt, to, logger)
		res.First, res.Last = first, last
		return res, nil // nothing to move
	}
	if derr == nil && d.kind == "" {
		return res, fmt.Errorf("cluster: data dir %s has no Raft state: nothing to move (a new directory takes --raft-log %s at the server's first start)", dir, to)
	}
	// A move cut short (derr != nil) is finished in the direction asked.
	res.From = otherLogStore(to)
	if derr == nil {
		res.From = d.kind
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, newHCLogger("snapshot", logger))
	if err != nil {
		return res, fmt.Errorf("cluster: snapshot store: %w", err)
	}
	snapIndex := latestSnapshotIndex(snaps)

	backup, err := backupRaftDB(dir, "log", bolt)
	if err != nil {
		return res, err
	}
	res.Backup = backup
	logger.Info("raft.db backed up", "backup", backup)

	if derr != nil && d.kind == to {
		// A move away from to was cut short before it recorded the
		// other store: to's log is whole, the other store's entries
		// are a partial copy. Set them aside.
		res.From = otherLogStore(to)
		// keepLog fills res: call it before res is read (in "return res,
		// f(&res)" Go does not order the two).
		err := keepLog(dir, bolt, to, backup, &res, logger)
		return res, err
	}

	if to == LogStoreWAL {
		err = migrateToWAL(dir, bolt, snapIndex, &res, logger)
	} else {
		// To raft.db: copy wal/'s entries, record raft.db as the store,
		// then move wal/ into the backup.
		err = migrateToBolt(dir, bolt, snapIndex, backup, &res, logger)
	}
	return res, err
}

// migrateToWAL copies raft.db's entries above snapIndex into wal/ and
// records wal/ as the store in the same transaction; on a failure raft.db is
// unchanged and a wal/ it created is removed.
func migrateToWAL(dir string, bolt *boltStore, snapIndex uint64, res *MigrateResult, logger *slog.Logger) error {
	fresh := !walPresent(dir)
	w, err := openWAL(dir, logger)
	if err != nil {
		return err
	}
	defer w.Close()
	res.First, _ = bolt.FirstIndex()
	res.Last, _ = bolt.LastIndex()
	// raft.db's entries go in the transaction that records wal/.
	err = migrateLogs(w, bolt, "raft.db", snapIndex, logger, func(first, last uint64) error {
		return bolt.upgrade(LogStoreWAL, first, last)
	})
	if err != nil {
		// raft.db was not changed: a wal/ this run created goes,
		// and the server starts on raft.db's log as before.
		if fresh {
			w.Close()
			if rerr := os.RemoveAll(filepath.Join(dir, walDir)); rerr != nil {
				err = fmt.Errorf("%w; remove the new wal/: %v", err, rerr)
			}
		}
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("cluster: close the new log: %w", err)
	}
	return nil
}

// migrateToBolt copies wal/'s entries above snapIndex into raft.db, records
// raft.db as the store, then moves wal/ into the backup.
func migrateToBolt(dir string, bolt *boltStore, snapIndex uint64, backup string, res *MigrateResult, logger *slog.Logger) error {
	if walPresent(dir) {
		w, err := openWAL(dir, logger)
		if err != nil {
			return err
		}
		res.First, _ = w.FirstIndex()
		res.Last, _ = w.LastIndex()
		err = migrateLogs(bolt, w, "wal/", snapIndex, logger, func(first, last uint64) error {
			return bolt.upgrade(LogStoreBoltDB, 0, 0)
		})
		if cerr := w.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("cluster: close wal/: %w", cerr)
		}
		if err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(dir, walDir), filepath.Join(backup, walDir)); err != nil {
			return fmt.Errorf("cluster: move wal/ into the backup: %w", err)
		}
		return syncDir(dir)
	}
	if err := bolt.upgrade(LogStoreBoltDB, 0, 0); err != nil {
		return err
	}
	res.First, _ = bolt.FirstIndex()
	res.Last, _ = bolt.LastIndex()
	return nil
}

// keepLog ends a move away from kind that was cut short: it drops the
// entries copied to the other store (raft.db's are deleted in the
// transaction that records kind; wal/ goes into the backup) and records
// kind.
func keepLog(dir string, bolt *boltStore, kind, backup string, res *MigrateResult, logger *slog.Logger) error {
	if kind == LogStoreWAL {
		first, _ := bolt.FirstIndex()
		last, err := bolt.LastIndex()
		if err != nil {
			return err
		}
		logger.Info("dropping the partial copy of the log in raft.db", "first", first, "last", last)
		if err := bolt.upgrade(LogStoreWAL, first, last); err != nil {
			return err
		}
		res.First, res.Last, _ = logBounds(dir, bolt, kind, logger)
		return nil
	}
	logger.Info("moving the partial copy of the log in wal/ into the backup", "backup", backup)
	if err := os.Rename(filepath.Join(dir, walDir), filepath.Join(backup, walDir)); err != nil {
		return fmt.Errorf("cluster: move wal/ into the backup: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	if err := bolt.upgrade(LogStoreBoltDB, 0, 0); err != nil {
		return err
	}
	res.First, _ = bolt.FirstIndex()
	res.Last, _ = bolt.LastIndex()
	return nil
}

// otherLogStore is the log store that is not kind.
func otherLogStore(kind string) string {
	if kind == LogStoreWAL {
		return LogStoreBoltDB
	}
	return LogStoreWAL
}

// logBounds is the first and last index of the directory's log in kind.
func logBounds(dir string, bolt *boltStore, kind string, logger *slog.Logger) (uint64, uint64, error) {
	var src logSource = bolt
	if kind == LogStoreWAL {
		w, err := openWAL(dir, logger)
		if err != nil {
			return 0, 0, err
		}
		defer w.Close()
		src = w
	}
	first, err := src.FirstIndex()
	if err != nil {
		return 0, 0, err
	}
	last, err := src.LastIndex()
	return first, last, err
}

// backupRaftDB copies raft.db (a consistent copy, from a read transaction)
// into a new directory dir/<prefix>-backup-<UTC time> and fsyncs it there.
func backupRaftDB(dir, prefix string, bolt *boltStore) (string, error) {
	backup := filepath.Join(dir, prefix+"-backup-"+time.Now().UTC().Format("20060102T150405.000Z"))
	if err := os.Mkdir(backup, 0o700); err != nil {
		return "", fmt.Errorf("cluster: backup dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(backup, "raft.db"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("cluster: backup of raft.db: %w", err)
	}
	err = bolt.db.View(func(tx *bbolt.Tx) error {
		_, err := tx.WriteTo(f)
		return err
	})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(backup)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return "", fmt.Errorf("cluster: backup of raft.db in %s: %w", backup, err)
	}
	return backup, nil
}

// syncDir makes the entries of dir (a rename, a new file) durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
