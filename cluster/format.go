package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync/atomic"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"
)

// Data directory formats. The format is recorded in raft.db (the stable
// store's bucket, key formatKey) and checked when the directory is opened,
// before anything is served or voted: a format newer than DataFormat is
// refused.
//
//   - 1: the log and the stable store in raft.db (releases up to edecda9,
//     which record no format: a directory without one is format 1).
//   - 2: raft.db's log bucket holds formatGuard, which releases that
//     predate the check stop on (see formatGuard), and the log is where
//     logStoreKey (in the stable store's bucket) says: in raft.db's log
//     bucket ("boltdb", beside the guard) or in wal/ ("wal", raft-wal).
//     Format-2 directories of the releases before logStoreKey keep it in
//     wal/.
const DataFormat = 2

// raft.db's layout is raft-boltdb/v2's (releases of format 1 opened it
// with raft-boltdb): the log in bucket "logs" (keys big-endian indexes,
// values msgpack), the stable store in bucket "conf".
var (
	bucketLogs = []byte("logs")
	bucketConf = []byte("conf")
	// formatKey (in bucketConf) holds the data format, a big-endian uint64.
	formatKey = []byte("LeaseholdDataFormat")
	// logStoreKey (in bucketConf) names the log store of a format-2
	// directory: LogStoreBoltDB or LogStoreWAL.
	logStoreKey = []byte("LeaseholdRaftLog")
	// errKeyNotFound is a missing stable-store key: Raft tells it by this
	// message (as raft-boltdb's ErrKeyNotFound).
	errKeyNotFound = errors.New("not found")
)

// formatGuardIndex is the key, in raft.db's log bucket, of formatGuard.
const formatGuardIndex = math.MaxUint64

// formatGuard is the value at formatGuardIndex in raft.db's log bucket
// from format 2 on. A release that keeps its log in raft.db (format 1,
// which predates the format check) reads it as the last entry of its log
// when Raft starts and cannot decode it (0xc1 is no msgpack type): its
// raft.NewRaft fails with "failed to get last log at index
// 18446744073709551615: msgpack decode error [pos 1]: only encoded map or
// array can be decoded into a struct", before it restores a snapshot,
// serves or votes. Without it such a release would take an empty log
// (when it is in wal/) as the whole history, and, when the log is in
// raft.db, would start on a directory whose entries it may not read. The
// text after the first byte is for whoever inspects raft.db. When the log
// is in raft.db the guard sits beside it: boltStore's log never shows it.
var formatGuard = append([]byte{0xc1}, "leasehold: this raft.db is of data format 2 or later; "+
	"a release that reads its log from raft.db must not open it: see docs/operations.md, Rolling back"...)

// boltStore is raft.db: Raft's stable store, the data dir's lock (bbolt's
// file lock, taken at open), the data format, the log store's name, and
// Raft's log when the directory keeps it there (LogStoreBoltDB). Its
// layout is raft-boltdb/v2's; it is opened directly so that the format's
// guard, the log store's name and the removal of a moved log are written
// in one transaction, and so that its log never shows the guard.
type boltStore struct {
	db *bbolt.DB
	// mapped counts the bytes of log entries written or read since
	// releaseMapped last ran (see there).
	mapped atomic.Int64
}

// releaseMappedEvery is how many bytes of log entries written or read
// (raft.db's pages that this process maps as it reads them back) lead to
// releaseMapped.
const releaseMappedEvery = 16 << 20

// releaseMapped drops raft.db's pages from this process's page tables.
// bbolt reads its file through a shared read-only mapping: every page a
// transaction reads (the leaf each append rewrites, the entries a
// compaction deletes, every page the freelist's rebuild at open walks)
// stays mapped, and counted in the RSS, until the mapping is replaced.
// The page cache keeps the data: the next read of a page is a minor fault.
// A read transaction holds bbolt's mmap lock, so the mapping cannot move
// while the pages are dropped.
func (b *boltStore) releaseMapped() {
	b.mapped.Store(0)
	_ = b.db.View(func(tx *bbolt.Tx) error {
		return unmapPages(b.db.Info().Data, tx.Size())
	})
}

// touched counts n bytes of entries written or read and releases the
// mapped pages every releaseMappedEvery bytes.
func (b *boltStore) touched(n int) {
	if b.mapped.Add(int64(n)) >= releaseMappedEvery {
		b.releaseMapped()
	}
}

// openBolt opens (or creates) raft.db at path and checks its data format
// (see checkFormat) before it writes anything. A held lock fails after
// 2 s with bberrors.ErrTimeout. format is the directory's format before
// this open: 1 when none is recorded.
func openBolt(path string) (b *boltStore, format uint64, err error) {
	// fsync stays on (NoSync false). The freelist is not synced on every
	// commit (bbolt rebuilds it on open) and a large initial mmap avoids
	// remapping stalls.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true,
		FreelistType: bbolt.FreelistMapType, InitialMmapSize: 64 << 20})
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: open raft.db: %w", err)
	}
	db.NoSync, db.NoGrowSync = canaryNoSync, canaryNoSync
	b = &boltStore{db: db}
	if format, err = b.checkFormat(filepath.Dir(path)); err != nil {
		db.Close()
		return nil, format, err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketLogs, bucketConf} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, format, fmt.Errorf("cluster: open raft.db: %w", err)
	}
	b.releaseMapped() // the freelist's rebuild read every page
	return b, format, nil
}

// Close closes raft.db (and releases the data dir's lock).
func (b *boltStore) Close() error { return b.db.Close() }

// Set implements raft.StableStore.
func (b *boltStore) Set(k, v []byte) error {
	return b.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketConf).Put(k, v) })
}

// Get implements raft.StableStore.
func (b *boltStore) Get(k []byte) ([]byte, error) {
	var v []byte
	err := b.db.View(func(tx *bbolt.Tx) error {
		if val := tx.Bucket(bucketConf).Get(k); val != nil {
			v = append([]byte{}, val...)
		}
		return nil
	})
	if err == nil && v == nil {
		err = errKeyNotFound
	}
	return v, err
}

// SetUint64 implements raft.StableStore.
func (b *boltStore) SetUint64(k []byte, v uint64) error {
	return b.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

// GetUint64 implements raft.StableStore.
func (b *boltStore) GetUint64(k []byte) (uint64, error) {
	v, err := b.Get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raft.db: stable store key %q holds %d bytes, not a uint64", k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// format reads raft.db's data format: 1 when none is recorded.
func (b *boltStore) format() (uint64, error) {
	var v []byte
	err := b.db.View(func(tx *bbolt.Tx) error {
		if conf := tx.Bucket(bucketConf); conf != nil {
			v = append([]byte(nil), conf.Get(formatKey)...)
		}
		return nil
	})
	switch {
	case err != nil:
		return 0, err
	case v == nil:
		return 1, nil
	case len(v) != 8 || binary.BigEndian.Uint64(v) == 0:
		return 0, fmt.Errorf("%q is %x, not a data format", formatKey, v)
	}
	return binary.BigEndian.Uint64(v), nil
}

// checkFormat refuses a data dir (dir) of a format this release does not
// know, and returns the directory's format.
func (b *boltStore) checkFormat(dir string) (uint64, error) {
	f, err := b.format()
	if err != nil {
		return 0, fmt.Errorf("cluster: read the data format of %s: %w", filepath.Join(dir, "raft.db"), err)
	}
	if f > DataFormat {
		return f, fmt.Errorf("cluster: data dir %s is in data format %d, written by a newer leasehold release; "+
			"this release reads data formats 1 to %d and does not start on it (nothing was changed). "+
			"Run the newer release on this directory, or roll back as docs/operations.md says (\"Rolling back\": "+
			"take a snapshot with the newer release and restore it into a new cluster of this release)", dir, f, DataFormat)
	}
	return f, nil
}

// logStore is the log store raft.db records ("" when none is).
func (b *boltStore) logStore() (string, error) {
	v, err := b.Get(logStoreKey)
	if errors.Is(err, errKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	switch s := string(v); s {
	case LogStoreBoltDB, LogStoreWAL:
		return s, nil
	}
	return "", fmt.Errorf("raft.db: %q is %q, not a log store", logStoreKey, v)
}

// upgrade deletes the log entries first..last from raft.db's log bucket
// (none when last is 0), and records DataFormat, its guard and the log
// store (kind), in one transaction: a crash leaves either the directory
// as it was or the new one.
func (b *boltStore) upgrade(kind string, first, last uint64) error {
	return b.db.Update(func(tx *bbolt.Tx) error {
		if last > 0 {
			if err := deleteLogs(tx, first, last); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketLogs).Put(binary.BigEndian.AppendUint64(nil, formatGuardIndex), formatGuard); err != nil {
			return err
		}
		if err := tx.Bucket(bucketConf).Put(logStoreKey, []byte(kind)); err != nil {
			return err
		}
		return tx.Bucket(bucketConf).Put(formatKey, binary.BigEndian.AppendUint64(nil, DataFormat))
	})
}

// deleteLogs deletes the log entries first..last (never the guard).
func deleteLogs(tx *bbolt.Tx, first, last uint64) error {
	// Seek again after each delete rather than trust the cursor's
	// position after one.
	c := tx.Bucket(bucketLogs).Cursor()
	from := binary.BigEndian.AppendUint64(nil, first)
	for k, _ := c.Seek(from); k != nil; k, _ = c.Seek(from) {
		if i := binary.BigEndian.Uint64(k); i > last || i == formatGuardIndex {
			break
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// The log in raft.db (raft.LogStore, and the migration's logSource): the
// guard is not an entry, and no write reaches it.

// FirstIndex is the first index of raft.db's log (0: empty).
func (b *boltStore) FirstIndex() (uint64, error) { return b.edge(true) }

// LastIndex is the last index of raft.db's log (0: empty).
func (b *boltStore) LastIndex() (uint64, error) { return b.edge(false) }

func (b *boltStore) edge(first bool) (uint64, error) {
	var idx uint64
	err := b.db.View(func(tx *bbolt.Tx) error {
		// The guard has the largest key: the log's last entry is the
		// one before it, and the log is empty if it is alone.
		c := tx.Bucket(bucketLogs).Cursor()
		k, _ := c.Last()
		if k != nil && binary.BigEndian.Uint64(k) == formatGuardIndex {
			k, _ = c.Prev()
		}
		if first && k != nil {
			k, _ = c.First()
		}
		if k != nil {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

// logEncoding and logDecoding are the msgpack handles of raft.db's log
// entries, as raft-boltdb/v2 encodes them (its default time format) and
// decodes them. Shared, because a handle caches what it learns of a type;
// handles are safe for concurrent use once configured.
var (
	logEncoding = &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: true}}
	logDecoding = &codec.MsgpackHandle{}
)

// GetLog reads entry idx of raft.db's log.
func (b *boltStore) GetLog(idx uint64, l *raft.Log) error {
	if idx == formatGuardIndex {
		return raft.ErrLogNotFound
	}
	n := 0
	err := b.db.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(binary.BigEndian.AppendUint64(nil, idx))
		if v == nil {
			return raft.ErrLogNotFound
		}
		n = len(v)
		return codec.NewDecoder(bytes.NewReader(v), logDecoding).Decode(l)
	})
	b.touched(n)
	return err
}

// StoreLogs appends logs to raft.db's log in one transaction (its commit
// is two writes, each fsynced), encoded as raft-boltdb does, and reports
// the time taken as boltStoreLogsMetric. The entries are encoded before
// the transaction begins, so the write lock is held for bbolt's own work
// only.
func (b *boltStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	for _, l := range logs {
		if l.Index == formatGuardIndex {
			return fmt.Errorf("raft.db: log index %d is the format guard's", l.Index)
		}
	}
	var buf bytes.Buffer
	enc := codec.NewEncoder(&buf, logEncoding)
	ends := make([]int, len(logs))
	var key [8]byte
	for i, l := range logs {
		binary.BigEndian.PutUint64(key[:], l.Index)
		buf.Write(key[:])
		if err := enc.Encode(l); err != nil {
			return err
		}
		ends[i] = buf.Len()
	}
	data := buf.Bytes()
	err := b.db.Update(func(tx *bbolt.Tx) error {
		bucket := tx.Bucket(bucketLogs)
		from := 0
		for _, end := range ends {
			if err := bucket.Put(data[from:from+8:from+8], data[from+8:end:end]); err != nil {
				return err
			}
			from = end
		}
		return nil
	})
	if err != nil {
		return err
	}
	metrics.MeasureSince(boltStoreLogsMetric, start)
	b.touched(len(data))
	return nil
}

// StoreLog appends one entry (see StoreLogs).
func (b *boltStore) StoreLog(l *raft.Log) error { return b.StoreLogs([]*raft.Log{l}) }

// DeleteRange deletes the entries min..max of raft.db's log, never the
// guard.
func (b *boltStore) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	err := b.db.Update(func(tx *bbolt.Tx) error { return deleteLogs(tx, min, max) })
	if err == nil {
		b.releaseMapped() // the deleted entries' pages were read to delete them
	}
	return err
}

// isLocked tells whether err is bbolt's answer to a held lock.
func isLocked(err error) bool { return errors.Is(err, bberrors.ErrTimeout) }
