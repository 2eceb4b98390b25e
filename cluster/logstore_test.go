package cluster

import (
	"bytes"
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

// TestOpenMovesLogOutOfRaftDB: a data dir whose log is in raft.db (made
// by a previous version) opens with its state, replays every command, and
// raft.db no longer holds log entries.
func TestOpenMovesLogOutOfRaftDB(t *testing.T) {
	const n = 300
	dir := oldDataDir(t, n)
	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, f)
	if err != nil {
		t.Fatal(err)
	}
	if !c.HadState {
		t.Fatal("the old data dir's state was not seen")
	}
	waitLeader(t, c)
	if err := c.Raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := f.n.Load(); got != n {
		t.Fatalf("replayed %d commands, want %d", got, n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	if last, err := bolt.LastIndex(); err != nil || last != 0 {
		t.Fatalf("raft.db still holds log entries up to %d (%v)", last, err)
	}
	if term, err := bolt.GetUint64([]byte("CurrentTerm")); err != nil || term < 1 {
		t.Fatalf("raft.db lost the current term: %d %v", term, err)
	}
}

// TestOpenMovesAGappedLogOutOfRaftDB: a data dir of a previous version
// whose raft.db log has a gap under its latest snapshot (a follower that
// installed a snapshot; a restored backup) opens: the state is the
// snapshot's plus the entries after it.
func TestOpenMovesAGappedLogOutOfRaftDB(t *testing.T) {
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

	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0"}, f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitLeader(t, c)
	if err := c.Raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := f.n.Load(); got != 101 {
		t.Fatalf("replayed %d commands after the snapshot at 200, want 101 (201-301)", got)
	}
}

// entry is log entry i of the migration tests.
func entry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d", i))}
}

// checkLog fails unless s holds exactly entries from..to, as entry makes them.
func checkLog(t *testing.T, s raft.LogStore, from, to uint64) {
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
			if err := migrateLogs(wal, src, 0, logger); err != nil {
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
		if err := migrateLogs(wal, src, 0, logger); err == nil {
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
		if err := migrateLogs(wal, src, 0, logger); err == nil {
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
			if err := migrateLogs(wal, src, 60, logger); err != nil {
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
		if err := migrateLogs(wal, src, 120, logger); err != nil {
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
		err = migrateLogs(wal, src, 40, logger)
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

// TestLogIsInWALDir: appends go to the segment files, not raft.db.
func TestLogIsInWALDir(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	marker := "marker-7f3a9c"
	if err := c.Raft.Apply([]byte(marker), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, walDir, "*.wal"))
	found := false
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		found = found || bytes.Contains(b, []byte(marker))
	}
	if !found {
		t.Fatalf("the entry is in no segment file (%v)", segs)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "raft.db")); bytes.Contains(b, []byte(marker)) {
		t.Fatal("the entry is in raft.db")
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
	wrap := func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
		return hidingLogs{l}, s
	}
	a, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true,
		TrailingLogs: 5}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	waitLeader(t, a)
	join := func(id string) (*Cluster, Config) {
		t.Helper()
		// The default TrailingLogs: installing a snapshot leaves the
		// follower's log untouched unless Raft knows it cannot hold a gap.
		cfg := Config{NodeID: id, Dir: t.TempDir(), BindAddr: "127.0.0.1:0", WrapStores: wrap}
		c, err := Open(cfg, &countFSM{})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Raft.AddVoter(raft.ServerID(id), c.Addr, 0, 10*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
		cfg.BindAddr = string(c.Addr)
		return c, cfg
	}
	c, _ := join("c")
	defer c.Close()
	b, bcfg := join("b")
	apply := func(n int) uint64 {
		t.Helper()
		var f raft.ApplyFuture
		for range n {
			f = a.Raft.Apply([]byte("x"), 10*time.Second)
		}
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		return f.Index()
	}
	waitApplied := func(c *Cluster, idx uint64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for c.Raft.AppliedIndex() < idx {
			if time.Now().After(deadline) {
				t.Fatalf("%s applied up to %d, want %d", c.cfg.NodeID, c.Raft.AppliedIndex(), idx)
			}
			<-time.After(10 * time.Millisecond)
		}
	}
	waitApplied(b, apply(10))
	// b stops with entries in its log; a moves on, snapshots and drops
	// the entries b lacks.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	apply(50)
	if err := a.Raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	apply(50)
	if err := a.Raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	b, err = Open(bcfg, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitApplied(b, apply(10))
	if b.Raft.Stats()["last_snapshot_index"] == "0" {
		t.Fatal("b caught up without a snapshot: the leader still read entries it had compacted")
	}
}

// TestLogAppendTimed: an append reports its time under raft-boltdb's
// metric name, which the slow-fsync alert and the dashboards read.
func TestLogAppendTimed(t *testing.T) {
	sink := metrics.NewInmemSink(time.Minute, time.Hour)
	cfg := metrics.DefaultConfig("t")
	cfg.EnableHostname, cfg.EnableRuntimeMetrics = false, false
	if _, err := metrics.NewGlobal(cfg, sink); err != nil {
		t.Fatal(err)
	}
	defer metrics.NewGlobal(cfg, &metrics.BlackholeSink{})
	c, err := Open(Config{NodeID: "a", Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitLeader(t, c)
	if err := c.Raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	for _, iv := range sink.Data() {
		iv.RLock()
		s, ok := iv.Samples["t.raft.boltdb.storeLogs"]
		iv.RUnlock()
		if ok && s.Count > 0 {
			return
		}
	}
	t.Fatal("no t.raft.boltdb.storeLogs sample")
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
	open := func() (*raftboltdb.BoltStore, *walStore) {
		t.Helper()
		bolt, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
		if err != nil {
			t.Fatal(err)
		}
		logs, err := openLogStore(dir, bolt, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
