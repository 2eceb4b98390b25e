package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// boltLogKeys is the first and last key of raft.db's log bucket, the
// format guard included (raft-boltdb sees it as an entry, as a release of
// format 1 does).
func boltLogKeys(t *testing.T, bolt *raftboltdb.BoltStore) (uint64, uint64) {
	t.Helper()
	first, err := bolt.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := bolt.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// recordedFormat is the data format raft.db in dir records (0: none).
func recordedFormat(t *testing.T, dir string) uint64 {
	t.Helper()
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	f, err := bolt.GetUint64(formatKey)
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func openClose(t *testing.T, dir string) {
	t.Helper()
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenRecordsDataFormat: a new data dir gets format 2, its guard and
// the log store it was given, and opens again. The guard is the last key
// of raft.db's log bucket whichever store holds the log.
func TestOpenRecordsDataFormat(t *testing.T) {
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			waitLeader(t, c)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if f := recordedFormat(t, dir); f != DataFormat {
				t.Fatalf("raft.db records data format %d, want %d", f, DataFormat)
			}
			bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
			if err != nil {
				t.Fatal(err)
			}
			first, last := boltLogKeys(t, bolt)
			wantFirst := uint64(formatGuardIndex)
			if kind == LogStoreBoltDB {
				wantFirst = 1 // the bootstrap configuration
			}
			if first != wantFirst || last != formatGuardIndex {
				t.Fatalf("raft.db's log bucket holds %d-%d, want %d-the format guard", first, last, wantFirst)
			}
			if v, err := bolt.Get(logStoreKey); err != nil || string(v) != kind {
				t.Fatalf("raft.db records log store %q, %v; want %s", v, err, kind)
			}
			bolt.Close()
			c, err = Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if !c.HadState {
				t.Fatal("the data dir's state was not seen on the second open")
			}
			waitLeader(t, c)
		})
	}
}

// TestOpenRefusesANewerDataFormat: a data dir that records a format newer
// than this release's is refused with both formats named, before the log,
// the snapshots or Raft are opened, and is left as it was.
func TestOpenRefusesANewerDataFormat(t *testing.T) {
	dir := t.TempDir()
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bolt.SetUint64(formatKey, DataFormat+1); err != nil {
		t.Fatal(err)
	}
	if err := bolt.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	bolt.Close()
	before, err := os.ReadFile(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err == nil {
		t.Fatal("a data dir of a newer format was opened")
	}
	for _, want := range []string{"data format 3", "formats 1 to 2", "newer leasehold release", "docs/operations.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	for _, sub := range []string{walDir, "snapshots"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); !os.IsNotExist(err) {
			t.Errorf("%s exists after the refusal (%v)", sub, err)
		}
	}
	if after, err := os.ReadFile(filepath.Join(dir, "raft.db")); err != nil || !bytes.Equal(after, before) {
		t.Errorf("raft.db changed in the refused open (%v)", err)
	}
	if f := recordedFormat(t, dir); f != DataFormat+1 {
		t.Fatalf("raft.db records format %d after the refusal", f)
	}
}

// TestARefusedMoveLeavesFormat1: a move of a format-1 data dir's log to
// wal/ that is refused (a gap no snapshot covers) leaves raft.db as the
// previous release left it: no format recorded, the whole log, no wal/.
func TestARefusedMoveLeavesFormat1(t *testing.T) {
	dir := oldDataDir(t, 300)
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bolt.DeleteRange(150, 200); err != nil {
		t.Fatal(err)
	}
	bolt.Close()
	if _, err := MigrateLog(dir, LogStoreWAL, nil); err == nil {
		t.Fatal("a log with a gap no snapshot covers was moved")
	}
	if f := recordedFormat(t, dir); f != 0 {
		t.Fatalf("raft.db records data format %d after a refused move", f)
	}
	bolt, err = raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	if first, last := boltLogKeys(t, bolt); first != 1 || last != 301 {
		t.Fatalf("raft.db's log holds %d-%d after a refused move, want 1-301", first, last)
	}
	if walPresent(dir) {
		t.Fatal("the refused move left a wal/ behind: the server would refuse the directory")
	}
}

// restoreFSM counts restores.
type restoreFSM struct {
	countFSM
	restores atomic.Int64
}

func (f *restoreFSM) Restore(rc io.ReadCloser) error {
	f.restores.Add(1)
	return rc.Close()
}

// openAsFormat1 opens dir as the release before the format check
// (edecda9, cluster.Open) did, with the same raft and raft-boltdb versions
// (v1.7.3, v2.3.1): raft.db as log store behind a LogCache and as stable
// store, then HasExistingState, then raft.NewRaft. That release started
// gossip between the two; nothing of it serves or votes before NewRaft
// returns.
func openAsFormat1(t *testing.T, dir string, fsm raft.FSM) (*raft.Raft, error) {
	t.Helper()
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"),
		BoltOptions: &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true,
			FreelistType: bbolt.FreelistMapType, InitialMmapSize: 64 << 20}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { bolt.Close() })
	cache, err := raft.NewLogCache(1024, bolt)
	if err != nil {
		return nil, err
	}
	fss, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		return nil, err
	}
	existing, err := raft.HasExistingState(cache, bolt, fss)
	if err != nil {
		return nil, err
	}
	if !existing {
		return nil, errors.New("no existing state seen")
	}
	_, trans := raft.NewInmemTransport("127.0.0.1:1")
	rc := raft.DefaultConfig()
	rc.LocalID = "a"
	rc.Logger = newHCLogger("raft", slog.New(slog.DiscardHandler))
	r, err := raft.NewRaft(rc, fsm, cache, bolt, fss, trans)
	if err == nil {
		t.Cleanup(func() { r.Shutdown().Error() })
	}
	return r, err
}

// TestPreviousReleaseStopsOnFormat2: the release before the format check
// fails to start Raft on a data dir this release wrote (format 2), before
// it restores a snapshot, serves or votes: it stops on the guard in
// raft.db's log. Without the guard it took raft.db's empty log for the
// whole history (issue 21). The same with the log in raft.db, beside the
// guard. The control: it opens a format-1 dir.
func TestPreviousReleaseStopsOnFormat2(t *testing.T) {
	t.Run("format 1 opens", func(t *testing.T) {
		f := &restoreFSM{}
		if _, err := openAsFormat1(t, oldDataDir(t, 10), f); err != nil {
			t.Fatal(err)
		}
	})
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run("format 2 with a snapshot is refused, "+kind, func(t *testing.T) {
			dir := t.TempDir()
			c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			waitLeader(t, c)
			for range 50 {
				if err := c.raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
			for range 20 {
				if err := c.raft.Apply([]byte("y"), 5*time.Second).Error(); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			f := &restoreFSM{}
			_, err = openAsFormat1(t, dir, f)
			if err == nil || !strings.Contains(err.Error(), "failed to get last log at index 18446744073709551615") {
				t.Fatalf("the previous release's open = %v, want it to fail on the format guard", err)
			}
			if n := f.restores.Load(); n != 0 {
				t.Fatalf("the previous release restored a snapshot %d times before failing", n)
			}
			t.Logf("the previous release's Raft: %v", err)
		})
		t.Run("new empty format 2 is refused, "+kind, func(t *testing.T) {
			dir := t.TempDir()
			c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", LogStore: kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if _, err := openAsFormat1(t, dir, &restoreFSM{}); err == nil || !strings.Contains(err.Error(), "18446744073709551615") {
				t.Fatalf("the previous release's open = %v, want it to fail on the format guard", err)
			}
		})
	}
}

// TestBoltStoreLogViewHidesTheGuard: raft.db's log (as Raft and the move
// read it) never shows the format guard: upgrade deletes the range it is
// given and keeps the guard, appends and deletes around it leave it, and
// an append at its index is refused.
func TestBoltStoreLogViewHidesTheGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	rb, err := raftboltdb.NewBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(5); i <= 20; i++ {
		if err := rb.StoreLog(entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	rb.Close()
	b, format, err := openBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if format != 1 {
		t.Fatalf("a raft.db without a format reads as format %d, want 1", format)
	}
	checkLog(t, b, 5, 20)
	if err := b.upgrade(LogStoreBoltDB, 5, 10); err != nil {
		t.Fatal(err)
	}
	checkLog(t, b, 11, 20)
	var l raft.Log
	if err := b.GetLog(formatGuardIndex, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog of the guard's index = %v, want not found", err)
	}
	if f, err := b.format(); err != nil || f != DataFormat {
		t.Fatalf("format after upgrade = %d, %v", f, err)
	}
	// Raft's own writes: appends, a suffix and a prefix deleted, the
	// widest range deleted.
	for i := uint64(21); i <= 30; i++ {
		if err := b.StoreLog(entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	checkLog(t, b, 11, 30)
	if err := b.DeleteRange(26, formatGuardIndex); err != nil {
		t.Fatal(err)
	}
	checkLog(t, b, 11, 25)
	if err := b.DeleteRange(0, 12); err != nil {
		t.Fatal(err)
	}
	checkLog(t, b, 13, 25)
	if err := b.StoreLog(&raft.Log{Index: formatGuardIndex, Term: 1, Data: []byte("x")}); err == nil {
		t.Fatal("an append at the guard's index was taken")
	}
	if err := b.upgrade(LogStoreBoltDB, 13, 25); err != nil {
		t.Fatal(err)
	}
	if first, err := b.FirstIndex(); err != nil || first != 0 {
		t.Fatalf("first index with only the guard = %d, %v", first, err)
	}
	if last, err := b.LastIndex(); err != nil || last != 0 {
		t.Fatalf("last index with only the guard = %d, %v", last, err)
	}
	if err := b.DeleteRange(0, formatGuardIndex); err != nil {
		t.Fatal(err)
	}
	if err := b.db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketLogs).Get(binary.BigEndian.AppendUint64(nil, formatGuardIndex)); !bytes.Equal(v, formatGuard) {
			return fmt.Errorf("the guard is %q after deleting the whole log", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// cutShortMove is a format-1 data dir (n commands) whose log a crash
// stopped in the middle of its move to wal/: wal/ holds entries 1-to,
// raft.db all of them.
func cutShortMove(t *testing.T, n int) string {
	t.Helper()
	dir := oldDataDir(t, n)
	rb, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, walDir), 0o700); err != nil {
		t.Fatal(err)
	}
	wal, err := raftwal.Open(filepath.Join(dir, walDir), raftwal.WithMetaStore(&metadb.BoltMetaDB{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := copyLogs(wal, rb, "raft.db", 1, uint64(n+1)); err != nil {
		t.Fatal(err)
	}
	wal.Close()
	rb.Close()
	if f := recordedFormat(t, dir); f != 0 {
		t.Fatalf("format %d before the open", f)
	}
	return dir
}

// TestMigrateLogKeepsTheWholeLogOfACutShortMove: run the other way, the
// command keeps the store whose log is whole (raft.db's) and moves the
// partial copy (wal/) into the backup.
func TestMigrateLogKeepsTheWholeLogOfACutShortMove(t *testing.T) {
	const n = 300
	dir := cutShortMove(t, n)
	res, err := MigrateLog(dir, LogStoreBoltDB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if walPresent(dir) {
		t.Fatal("wal/ is still in the data dir")
	}
	if _, err := os.Stat(filepath.Join(res.Backup, walDir, "wal-meta.db")); err != nil {
		t.Fatalf("the partial wal/ is not in the backup: %v", err)
	}
	replay(t, dir, n)
}

// TestMigrateLogFinishesACutShortMove: a move out of raft.db that a
// crash cut short after the copy (wal/ holds every entry, raft.db still
// does too, no format recorded; an earlier build moved the log at start)
// is refused by Open, which names the command that finishes it; the
// command finishes it and records format 2 with raft.db's log deleted in
// the same transaction.
func TestMigrateLogFinishesACutShortMove(t *testing.T) {
	const n = 300
	dir := cutShortMove(t, n)
	_, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, &countFSM{})
	if err == nil || !strings.Contains(err.Error(), "leasehold data migrate-log --data-dir "+dir+" --to wal") {
		t.Fatalf("Open of a cut-short move = %v, want a refusal naming the command", err)
	}
	if f := recordedFormat(t, dir); f != 0 {
		t.Fatalf("format %d after the refused open", f)
	}
	res, err := MigrateLog(dir, LogStoreWAL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != LogStoreBoltDB || res.First != 1 || res.Last != n+1 {
		t.Fatalf("MigrateLog = %+v", res)
	}
	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, f)
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := f.n.Load(); got != n {
		t.Fatalf("replayed %d commands, want %d", got, n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if f := recordedFormat(t, dir); f != DataFormat {
		t.Fatalf("format %d after the move, want %d", f, DataFormat)
	}
	rb, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	if first, last := boltLogKeys(t, rb); first != formatGuardIndex || last != formatGuardIndex {
		t.Fatalf("raft.db's log bucket holds %d-%d, want only the format guard", first, last)
	}
}

// TestMigrateLogKeepsWALOfACutShortMove: a move out of wal/ cut short
// (raft.db holds a partial copy, the store is still wal) is refused at
// open; run with --to wal, the command drops raft.db's copy (the guard
// stays) and the directory replays its wal/ log.
func TestMigrateLogKeepsWALOfACutShortMove(t *testing.T) {
	dir := t.TempDir()
	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: LogStoreWAL}, f)
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	for range 30 {
		if err := c.raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	bolt, _, err := openBolt(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := openWAL(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := copyLogs(bolt, w, "wal/", 1, 10); err != nil {
		t.Fatal(err)
	}
	w.Close()
	bolt.Close()
	_, err = Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, &countFSM{})
	if err == nil || !strings.Contains(err.Error(), "raft.db holds log entries 1-10 too") {
		t.Fatalf("Open of a cut-short move out of wal/ = %v", err)
	}
	if _, err := MigrateLog(dir, LogStoreWAL, nil); err != nil {
		t.Fatal(err)
	}
	replay(t, dir, 30)
	rb, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	if first, last := boltLogKeys(t, rb); first != formatGuardIndex || last != formatGuardIndex {
		t.Fatalf("raft.db's log bucket holds %d-%d, want only the format guard", first, last)
	}
}
