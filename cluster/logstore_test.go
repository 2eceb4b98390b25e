package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
)

// oldDataDir makes a data dir as a version that kept the log in raft.db
// did: a bootstrapped single-server cluster named "a" whose log holds the
// configuration then n commands.
func oldDataDir(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("a")
	rc := raft.DefaultConfig()
	rc.LocalID = "a"
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "a", Address: "127.0.0.1:1"}}}
	if err := raft.BootstrapCluster(rc, bolt, bolt, snaps, trans, conf); err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	for i := range n {
		logs = append(logs, &raft.Log{Index: uint64(2 + i), Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d", i))})
	}
	if err := bolt.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	return dir
}

type io2discard struct{}

func (io2discard) Write(p []byte) (int, error) { return len(p), nil }

// replay opens dir (any store), checks that Raft replays want commands,
// and closes it.
func replay(t *testing.T, dir string, want int64) {
	t.Helper()
	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, f)
	if err != nil {
		t.Fatal(err)
	}
	if !c.HadState {
		t.Fatal("the data dir's state was not seen")
	}
	waitLeader(t, c)
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := f.n.Load(); got != want {
		t.Fatalf("replayed %d commands, want %d", got, want)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenKeepsAnOldDirsLogInRaftDB: a data dir whose log is in raft.db
// (made by a previous version) opens with its state and replays every
// command; its log stays in raft.db (no wal/), whatever the default for
// new directories, and raft.db records format 2 and the store.
func TestOpenKeepsAnOldDirsLogInRaftDB(t *testing.T) {
	const n = 300
	dir := oldDataDir(t, n)
	replay(t, dir, n)
	if _, err := os.Stat(filepath.Join(dir, walDir)); !os.IsNotExist(err) {
		t.Fatalf("wal/ exists (%v)", err)
	}
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	if first, last := boltLogKeys(t, bolt); first != 1 || last != formatGuardIndex {
		t.Fatalf("raft.db's log bucket holds %d-%d, want 1 to the format guard", first, last)
	}
	if v, err := bolt.Get(logStoreKey); err != nil || string(v) != LogStoreBoltDB {
		t.Fatalf("raft.db records log store %q, %v", v, err)
	}
	if term, err := bolt.GetUint64([]byte("CurrentTerm")); err != nil || term < 1 {
		t.Fatalf("raft.db lost the current term: %d %v", term, err)
	}
}

// TestOpenRefusesAnotherLogStore: --raft-log (Config.LogStore) chooses
// the store of a new directory only: one that names another store than an
// existing directory's is refused, both named, nothing changed; the
// directory's own store, or none, opens.
func TestOpenRefusesAnotherLogStore(t *testing.T) {
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			waitLeader(t, c)
			c.Close()
			other := otherLogStore(kind)
			_, err = Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", LogStore: other}, &countFSM{})
			if err == nil {
				t.Fatalf("a %s directory opened with LogStore %s", kind, other)
			}
			for _, want := range []string{"--raft-log " + other, "keeps its raft log in " + logLocation(kind) + " (" + kind + ")",
				"leasehold data migrate-log --data-dir " + dir + " --to " + other} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not say %q", err, want)
				}
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("refusal %v is not ErrInvalidConfig", err)
			}
			if _, err := os.Stat(filepath.Join(dir, walDir)); (kind == LogStoreWAL) != (err == nil) {
				t.Errorf("wal/ after the refusal: %v", err)
			}
			for _, ls := range []string{kind, ""} {
				c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", LogStore: ls}, &countFSM{})
				if err != nil {
					t.Fatalf("LogStore %q: %v", ls, err)
				}
				c.Close()
			}
		})
	}
	if _, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", LogStore: "rocks"}, &countFSM{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("LogStore rocks: %v", err)
	}
}

// TestMigrateLogBothWays: the offline command moves an old directory's
// log from raft.db to wal/ and back; each move keeps a backup (raft.db as
// it was; wal/ itself on the way out of it), the directory replays every
// command after each, and a move to the store in use changes nothing.
func TestMigrateLogBothWays(t *testing.T) {
	const n = 300
	dir := oldDataDir(t, n)
	res, err := MigrateLog(dir, LogStoreWAL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != LogStoreBoltDB || res.To != LogStoreWAL || res.First != 1 || res.Last != n+1 || res.Backup == "" {
		t.Fatalf("to wal: %+v", res)
	}
	old, err := raftboltdb.NewBoltStore(filepath.Join(res.Backup, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if first, last := boltLogKeys(t, old); first != 1 || last != n+1 {
		t.Fatalf("the backup's raft.db holds %d-%d, want the whole log 1-%d", first, last, n+1)
	}
	old.Close()
	if f := recordedFormat(t, dir); f != DataFormat {
		t.Fatalf("format %d after the move", f)
	}
	replay(t, dir, n)
	if res, err := MigrateLog(dir, LogStoreWAL, nil); err != nil || res.Backup != "" || res.From != LogStoreWAL {
		t.Fatalf("a second move to wal: %+v, %v; want nothing done", res, err)
	}

	res, err = MigrateLog(dir, LogStoreBoltDB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != LogStoreWAL || res.First == 0 || res.Last < n+1 {
		t.Fatalf("to boltdb: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(dir, walDir)); !os.IsNotExist(err) {
		t.Fatalf("wal/ is still in the data dir (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(res.Backup, walDir, "wal-meta.db")); err != nil {
		t.Fatalf("wal/ is not in the backup: %v", err)
	}
	replay(t, dir, n)
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	if v, err := bolt.Get(logStoreKey); err != nil || string(v) != LogStoreBoltDB {
		t.Fatalf("raft.db records log store %q, %v", v, err)
	}
}

// TestMigrateLogRefusesWhileAServerRuns: the move is offline only: with
// a server on the directory (raft.db's lock) it is refused and nothing
// changes, no backup made.
func TestMigrateLogRefusesWhileAServerRuns(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: LogStoreBoltDB}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitLeader(t, c)
	_, err = MigrateLog(dir, LogStoreWAL, nil)
	if err == nil || !strings.Contains(err.Error(), "a leasehold server runs on data dir") {
		t.Fatalf("MigrateLog with a server running = %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "log-backup-*")); len(m) > 0 || walPresent(dir) {
		t.Fatalf("the refused move left %v (wal: %v)", m, walPresent(dir))
	}
	if _, err := MigrateLog(t.TempDir(), LogStoreWAL, nil); err == nil {
		t.Fatal("a directory without raft.db was taken for a data dir")
	}
	if _, err := MigrateLog(dir, "rocks", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("--to rocks: %v", err)
	}
}

// TestMigrateLogMovesAGappedLog: a data dir of a previous version whose
// raft.db log has a gap under its latest snapshot (a follower that
// installed a snapshot; a restored backup) moves to wal/ and opens: the
// state is the snapshot's plus the entries after it.
func TestMigrateLogMovesAGappedLog(t *testing.T) {
	dir := oldDataDir(t, 300) // entries 1 (configuration) to 301
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("a")
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "a", Address: "127.0.0.1:1"}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, 200, 1, conf, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bolt.DeleteRange(150, 200); err != nil {
		t.Fatal(err)
	}
	bolt.Close()

	if _, err := MigrateLog(dir, LogStoreWAL, nil); err != nil {
		t.Fatal(err)
	}
	replay(t, dir, 101) // 201-301, after the snapshot at 200
}

// entry is log entry i of the migration tests.
func entry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d", i))}
}

// checkLog fails unless s holds exactly entries from..to, as entry makes them.
func checkLog(t *testing.T, s logSource, from, to uint64) {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != from || last != to {
		t.Fatalf("log holds %d-%d, want %d-%d", first, last, from, to)
	}
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil || !bytes.Equal(l.Data, entry(i).Data) {
			t.Fatalf("entry %d: %q %v", i, l.Data, err)
		}
	}
}

// TestMigrateLogsFinishesACutShortMove: a move that a crash cut short
// (the new log holds a prefix) copies only the rest; a move cut short
// after the copy only deletes; a log that does not continue raft.db's is
// refused and nothing changes.
func TestMigrateLogsFinishesACutShortMove(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	fill := func(s raft.LogStore, from, to uint64) {
		t.Helper()
		for i := from; i <= to; i++ {
			if err := s.StoreLog(entry(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		walTo uint64
	}{{"prefix copied", 40}, {"all copied", 100}, {"nothing copied", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			src := raft.NewInmemStore()
			fill(src, 10, 100)
			wal, err := raftwal.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer wal.Close()
			if tc.walTo > 0 {
				fill(wal, 10, tc.walTo)
			}
			if err := migrateLogs(wal, src, "raft.db", 0, logger, src.DeleteRange); err != nil {
				t.Fatal(err)
			}
			checkLog(t, wal, 10, 100)
			if last, _ := src.LastIndex(); last != 0 {
				t.Fatalf("the source still holds entries up to %d", last)
			}
		})
	}
	t.Run("unrelated log refused", func(t *testing.T) {
		src := raft.NewInmemStore()
		fill(src, 10, 100)
		wal, err := raftwal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer wal.Close()
		fill(wal, 50, 60)
		if err := migrateLogs(wal, src, "raft.db", 0, logger, src.DeleteRange); err == nil {
			t.Fatal("a log that does not start where raft.db's does was merged")
		}
		checkLog(t, src, 10, 100)
		checkLog(t, wal, 50, 60)
	})
	t.Run("log of another history refused", func(t *testing.T) {
		src := raft.NewInmemStore()
		fill(src, 10, 100)
		wal, err := raftwal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer wal.Close()
		fill(wal, 10, 59)
		if err := wal.StoreLog(&raft.Log{Index: 60, Term: 2, Type: raft.LogCommand, Data: entry(60).Data}); err != nil {
			t.Fatal(err)
		}
		if err := migrateLogs(wal, src, "raft.db", 0, logger, src.DeleteRange); err == nil {
			t.Fatal("a log whose entry 60 is of another term was continued with raft.db's")
		}
		checkLog(t, src, 10, 100)
	})
}

// TestMigrateLogsAcrossAGap: raft.db's log has a gap where the previous
// version installed a snapshot or restored a backup. With a snapshot that
// covers it, the entries after the gap move (also when a crash cut the
// move short) and those before it are dropped; without one, the move is
// refused and nothing changes.
func TestMigrateLogsAcrossAGap(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	gapped := func() *raft.InmemStore {
		s := raft.NewInmemStore()
		for _, r := range [][2]uint64{{10, 30}, {50, 100}} {
			for i := r[0]; i <= r[1]; i++ {
				if err := s.StoreLog(entry(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		return s
	}
	for _, walTo := range []uint64{0, 70, 100} {
		t.Run(fmt.Sprint("new log up to ", walTo), func(t *testing.T) {
			src := gapped()
			wal, err := raftwal.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer wal.Close()
			for i := uint64(50); i <= walTo; i++ {
				if err := wal.StoreLog(entry(i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := migrateLogs(wal, src, "raft.db", 60, logger, src.DeleteRange); err != nil {
				t.Fatal(err)
			}
			checkLog(t, wal, 50, 100)
			if last, _ := src.LastIndex(); last != 0 {
				t.Fatalf("raft.db still holds entries up to %d", last)
			}
		})
	}
	t.Run("snapshot past the log", func(t *testing.T) {
		src := gapped()
		wal, err := raftwal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer wal.Close()
		if err := migrateLogs(wal, src, "raft.db", 120, logger, src.DeleteRange); err != nil {
			t.Fatal(err)
		}
		if last, _ := wal.LastIndex(); last != 0 {
			t.Fatalf("the new log holds entries up to %d below the snapshot at 120", last)
		}
		if last, _ := src.LastIndex(); last != 0 {
			t.Fatalf("raft.db still holds entries up to %d", last)
		}
		// Raft's next entry follows the snapshot.
		if err := wal.StoreLog(entry(121)); err != nil {
			t.Fatalf("append after the snapshot: %v", err)
		}
	})
	t.Run("gap no snapshot covers", func(t *testing.T) {
		src := gapped()
		wal, err := raftwal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer wal.Close()
		err = migrateLogs(wal, src, "raft.db", 40, logger, src.DeleteRange)
		if err == nil || !strings.Contains(err.Error(), "no entry 49") {
			t.Fatalf("a gap at 31-49 with a snapshot at 40: %v, want a refusal naming entry 49", err)
		}
		if first, _ := src.FirstIndex(); first != 10 {
			t.Fatalf("raft.db's log starts at %d after a refused move", first)
		}
		if last, _ := wal.LastIndex(); last != 0 {
			t.Fatalf("the new log holds entries up to %d after a refused move", last)
		}
	})
}

// TestLogIsWhereTheStoreKeepsIt: with wal, appends go to the segment
// files, not raft.db; with boltdb, to raft.db and no wal/ exists.
func TestLogIsWhereTheStoreKeepsIt(t *testing.T) {
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			waitLeader(t, c)
			marker := "marker-7f3a9c"
			if err := c.raft.Apply([]byte(marker), 5*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			segs, _ := filepath.Glob(filepath.Join(dir, walDir, "*.wal"))
			inWAL := false
			for _, p := range segs {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				inWAL = inWAL || bytes.Contains(b, []byte(marker))
			}
			b, _ := os.ReadFile(filepath.Join(dir, "raft.db"))
			inBolt := bytes.Contains(b, []byte(marker))
			if inWAL != (kind == LogStoreWAL) || inBolt != (kind == LogStoreBoltDB) {
				t.Fatalf("the entry is in a segment file: %v, in raft.db: %v", inWAL, inBolt)
			}
			if kind == LogStoreBoltDB && len(segs) > 0 {
				t.Fatalf("segment files with the log in raft.db: %v", segs)
			}
		})
	}
}

// TestLogStoreNeverHoldsAGap: the server's log store does not claim to be
// monotonic (hashicorp/raft#697: Raft then empties a log that ran past an
// installed snapshot and panics on the next commit), keeps the entries
// above a snapshot Raft leaves alone, and empties itself before an append
// that would leave a gap (the first after a snapshot newer than the whole
// log; raft-wal refuses a gap), on both stores.
func TestLogStoreNeverHoldsAGap(t *testing.T) {
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) {
			var inner raft.LogStore
			if kind == LogStoreWAL {
				w, err := raftwal.Open(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				inner = w
			} else {
				b, err := raftboltdb.NewBoltStore(filepath.Join(t.TempDir(), "raft.db"))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				inner = b
			}
			g := &gaplessLogs{LogStore: inner}
			var ls raft.LogStore = g
			if m, ok := ls.(raft.MonotonicLogStore); ok && m.IsMonotonic() {
				t.Fatal("the log store claims to be monotonic: Raft would empty a log that ran past an installed snapshot")
			}
			entries := func(lo, hi uint64) []*raft.Log {
				var out []*raft.Log
				for i := lo; i <= hi; i++ {
					out = append(out, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: []byte(fmt.Sprint(i))})
				}
				return out
			}
			span := func() (uint64, uint64) {
				t.Helper()
				first, err := g.FirstIndex()
				if err != nil {
					t.Fatal(err)
				}
				last, err := g.LastIndex()
				if err != nil {
					t.Fatal(err)
				}
				return first, last
			}
			if err := g.StoreLogs(entries(1, 20)); err != nil {
				t.Fatal(err)
			}
			// An installed snapshot at 15 with entries up to 20: Raft
			// compacts the prefix; what is above 15 stays and follows on.
			if err := g.DeleteRange(1, 15); err != nil {
				t.Fatal(err)
			}
			if err := g.StoreLogs(entries(21, 25)); err != nil {
				t.Fatal(err)
			}
			if first, last := span(); first != 16 || last != 25 {
				t.Fatalf("log holds %d-%d, want 16-25", first, last)
			}
			// A snapshot at 40, newer than the whole log: the next append
			// (41) replaces the log instead of leaving a gap.
			if err := g.StoreLog(entries(41, 41)[0]); err != nil {
				t.Fatalf("append past a snapshot newer than the log: %v", err)
			}
			if err := g.StoreLogs(entries(42, 43)); err != nil {
				t.Fatal(err)
			}
			if first, last := span(); first != 41 || last != 43 {
				t.Fatalf("log holds %d-%d after an append past the gap, want 41-43", first, last)
			}
			var l raft.Log
			if err := g.GetLog(42, &l); err != nil || string(l.Data) != "42" {
				t.Fatalf("entry 42: %q, %v", l.Data, err)
			}
			if err := g.GetLog(25, &l); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("entry 25 from before the gap: err %v, want ErrLogNotFound", err)
			}
			// A tail truncation (a follower's conflicting entries) and
			// then an append that does not follow what is left: the
			// wrapper's own idea of the last index (kept from its appends)
			// must not outlive the truncation.
			if err := g.DeleteRange(42, 43); err != nil {
				t.Fatal(err)
			}
			if err := g.StoreLogs(entries(44, 44)); err != nil {
				t.Fatalf("append past a truncated tail: %v", err)
			}
			if first, last := span(); first != 44 || last != 44 {
				t.Fatalf("log holds %d-%d after an append past a truncated tail, want 44-44", first, last)
			}
		})
	}
}

// hidingLogs wraps a log store without passing raft.MonotonicLogStore on,
// as store wrappers (fault injection) do.
type hidingLogs struct{ raft.LogStore }

// TestFollowerCatchesUpBySnapshotBehindAStoreWrapper: a follower whose log
// is behind the leader's compacted log gets the leader's snapshot (not
// entries the leader removed), installs it and keeps appending, even when
// its log store is wrapped by something that does not say the log cannot
// hold a gap (raft-wal refuses one).
func TestFollowerCatchesUpBySnapshotBehindAStoreWrapper(t *testing.T) {
	for _, kind := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) { followerCatchesUp(t, kind) })
	}
}

func followerCatchesUp(t *testing.T, kind string) {
	wrap := func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
		return hidingLogs{l}, s
	}
	// Slower than the LAN defaults (a 250 ms leader lease): with b down,
	// a loaded machine that delays one heartbeat to c deposes a. Should
	// it happen anyway, the writes go to whichever of a and c leads, and
	// both compact their logs (TrailingLogs 5, snapshots taken on each):
	// b must get a snapshot from either.
	timing := func(cfg Config) Config {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 1500*time.Millisecond, 1500*time.Millisecond, 750*time.Millisecond
		return cfg
	}
	a, err := Open(timing(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true,
		TrailingLogs: 5, LogStore: kind}), &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	waitLeader(t, a)
	join := func(cfg Config) *Cluster {
		t.Helper()
		c, err := Open(timing(cfg), &countFSM{})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.raft.AddVoter(raft.ServerID(cfg.NodeID), raft.ServerAddress(c.Addr), 0, 10*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := join(Config{NodeID: "c", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", TrailingLogs: 5, LogStore: kind})
	defer c.Close()
	// b: the default TrailingLogs: installing a snapshot leaves the
	// follower's log untouched unless Raft knows it cannot hold a gap.
	bcfg := Config{NodeID: "b", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", WrapStores: wrap, LogStore: kind}
	b := join(bcfg)
	bcfg.BindAddr = string(b.Addr)
	// apply writes n entries through the leader (again, through the new
	// one, if leadership moved meanwhile) and returns the last's index.
	apply := func(n int) uint64 {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			l := a
			if c.raft.State() == raft.Leader {
				l = c
			}
			var f raft.ApplyFuture
			for range n {
				f = l.raft.Apply([]byte("x"), 10*time.Second)
			}
			err := f.Error()
			if err == nil {
				return f.Index()
			}
			if !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost) || time.Now().After(deadline) {
				t.Fatal(err)
			}
			t.Logf("%s lost the leadership (%v): again", l.cfg.NodeID, err)
			<-time.After(50 * time.Millisecond)
		}
	}
	waitApplied := func(c *Cluster, idx uint64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for c.raft.AppliedIndex() < idx {
			if time.Now().After(deadline) {
				t.Fatalf("%s applied up to %d, want %d", c.cfg.NodeID, c.raft.AppliedIndex(), idx)
			}
			<-time.After(10 * time.Millisecond)
		}
	}
	snapshot := func() {
		t.Helper()
		for _, s := range []*Cluster{a, c} {
			if err := s.raft.Snapshot().Error(); err != nil {
				t.Fatalf("snapshot on %s: %v", s.cfg.NodeID, err)
			}
		}
	}
	waitApplied(b, apply(10))
	// b stops with entries in its log; a and c move on, snapshot and drop
	// the entries b lacks.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		idx := apply(50)
		waitApplied(a, idx)
		waitApplied(c, idx)
		snapshot()
	}
	b, err = Open(timing(bcfg), &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitApplied(b, apply(10))
	if b.raft.Stats()["last_snapshot_index"] == "0" {
		t.Fatal("b caught up without a snapshot: the leader still read entries it had compacted")
	}
}

// TestLogAppendTimed: an append reports its time under its store's name:
// raft-boltdb's for boltdb, raft.wal.storeLogs for wal (the slow-fsync
// alert and the dashboard read both); raft-wal's own metrics come too.
func TestLogAppendTimed(t *testing.T) {
	for _, tc := range []struct{ kind, sample, counter string }{
		{LogStoreBoltDB, "t.raft.boltdb.storeLogs", ""},
		{LogStoreWAL, "t.raft.wal.storeLogs", "t.raft.wal.log_appends"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			sink := metrics.NewInmemSink(time.Minute, time.Hour)
			cfg := metrics.DefaultConfig("t")
			cfg.EnableHostname, cfg.EnableRuntimeMetrics = false, false
			if _, err := metrics.NewGlobal(cfg, sink); err != nil {
				t.Fatal(err)
			}
			defer metrics.NewGlobal(cfg, &metrics.BlackholeSink{})
			c, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: tc.kind}, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			waitLeader(t, c)
			if err := c.raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			var sampled, counted bool
			var names []string
			for _, iv := range sink.Data() {
				iv.RLock()
				s, ok := iv.Samples[tc.sample]
				sampled = sampled || ok && s.Count > 0
				for k := range iv.Samples {
					names = append(names, k)
				}
				_, ok = iv.Counters[tc.counter]
				counted = counted || ok
				iv.RUnlock()
			}
			if !sampled {
				t.Fatalf("no %s sample (samples: %v)", tc.sample, names)
			}
			if tc.counter != "" && !counted {
				t.Fatalf("no %s counter", tc.counter)
			}
			other := "t.raft.wal.storeLogs"
			if tc.kind == LogStoreWAL {
				other = "t.raft.boltdb.storeLogs"
			}
			for _, n := range names {
				if n == other {
					t.Fatalf("a %s log reports %s", tc.kind, other)
				}
			}
		})
	}
}

// TestLogReopensAfterTailTruncation: a follower that drops the end of its
// log (raft's "clearing log suffix" when a new leader's log differs) and
// is then restarted must read its log again. raft-wal before v0.4.2 marked
// the truncated segment sealed without writing its index block, and every
// read of it after a restart failed ("sealed segment has no index block"):
// raft.NewRaft panicked at startup (hashicorp/raft-wal#31; seen in the
// chaos suite's kill-and-restart of three servers).
func TestLogReopensAfterTailTruncation(t *testing.T) {
	dir := t.TempDir()
	open := func() (*boltStore, *walStore) {
		t.Helper()
		bolt, _, err := openBolt(filepath.Join(dir, "raft.db"))
		if err != nil {
			t.Fatal(err)
		}
		logs, err := openWAL(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			bolt.Close()
			t.Fatal(err)
		}
		return bolt, logs
	}
	bolt, logs := open()
	var batch []*raft.Log
	for i := uint64(1); i <= 20; i++ {
		batch = append(batch, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d", i))})
	}
	if err := logs.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	// The new leader's log differs from index 18 on.
	if err := logs.DeleteRange(18, 20); err != nil {
		t.Fatal(err)
	}
	if err := logs.StoreLogs([]*raft.Log{{Index: 18, Term: 2, Type: raft.LogCommand, Data: []byte("new-18")}}); err != nil {
		t.Fatal(err)
	}
	logs.Close()
	bolt.Close()

	bolt, logs = open()
	defer bolt.Close()
	defer logs.Close()
	if last, err := logs.LastIndex(); err != nil || last != 18 {
		t.Fatalf("last index after restart = %d, %v; want 18", last, err)
	}
	for i := uint64(1); i <= 18; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			t.Fatalf("entry %d after restart: %v", i, err)
		}
		want := fmt.Sprintf("cmd-%d", i)
		if i == 18 {
			want = "new-18"
		}
		if string(l.Data) != want {
			t.Fatalf("entry %d after restart = %q, want %q", i, l.Data, want)
		}
	}
}
