package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// The durability suite (TestLogStoreDurability) runs the same faults
// against both log stores and checks what each does, as docs/operations.md
// reports it:
//
//   - recovers: the store keeps (or, after a restart, has) every entry it
//     acknowledged, as written, and takes the next append;
//   - wedges: every append fails from then on, also once the fault is
//     gone, until the server restarts.
//
// raft-wal's segments are made small here (durabilitySegment) so that
// the faults meet segment rotations; the server's are 64 MiB.

// durabilitySegment is raft-wal's segment size in the suite.
const durabilitySegment = 128 << 10

// durabilityEntry is entry i of the suite: 512 bytes that name i.
func durabilityEntry(i uint64) *raft.Log {
	data := bytes.Repeat([]byte(fmt.Sprintf("entry-%08d|", i)), 512/15+1)[:512]
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data}
}

// openStore opens dir's raft.db and log as Open does (kind for a new
// dir), without Raft. The closer closes both.
func openStore(dir, kind string) (raft.LogStore, func() error, error) {
	bolt, format, err := openBolt(filepath.Join(dir, "raft.db"))
	if err != nil {
		return nil, nil, err
	}
	logs, closer, err := openLogs(dir, bolt, format, kind, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		bolt.Close()
		return nil, nil, err
	}
	return logs, func() error { return errors.Join(closer.Close(), bolt.Close()) }, nil
}

// withSegmentSize sets raft-wal's segment size for the test.
func withSegmentSize(t *testing.T, size int) {
	old := walSegmentSize
	walSegmentSize = size
	t.Cleanup(func() { walSegmentSize = old })
}

// appendEntries appends entries from..to in batches of batch.
func appendEntries(s raft.LogStore, from, to uint64, batch int) error {
	for i := from; i <= to; i += uint64(batch) {
		var ls []*raft.Log
		for j := i; j <= to && j < i+uint64(batch); j++ {
			ls = append(ls, durabilityEntry(j))
		}
		if err := s.StoreLogs(ls); err != nil {
			return err
		}
	}
	return nil
}

// checkRecovered fails unless s holds 1..last with last >= acked, every
// entry as written, and takes entry last+1. It returns last.
func checkRecovered(t *testing.T, s raft.LogStore, acked uint64) uint64 {
	t.Helper()
	first, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if acked > 0 && (first != 1 || last < acked) {
		t.Fatalf("the log holds %d-%d, but entries 1-%d were acknowledged", first, last, acked)
	}
	for i := first; i <= last && i > 0; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("entry %d of %d-%d: %v", i, first, last, err)
		}
		if !bytes.Equal(l.Data, durabilityEntry(i).Data) {
			t.Fatalf("entry %d reads %q", i, l.Data)
		}
	}
	if err := s.StoreLogs([]*raft.Log{durabilityEntry(last + 1)}); err != nil {
		t.Fatalf("append %d after recovery: %v", last+1, err)
	}
	return last
}

var logStores = []string{LogStoreBoltDB, LogStoreWAL}

// TestLogStoreDurability: see the comment above durabilitySegment.
func TestLogStoreDurability(t *testing.T) {
	for _, kind := range logStores {
		t.Run(kind, func(t *testing.T) {
			withSegmentSize(t, durabilitySegment)
			t.Run("kill -9 during appends", func(t *testing.T) { killDuringAppends(t, kind) })
			t.Run("torn last write", func(t *testing.T) { tornTail(t, kind, false) })
			t.Run("truncated last file", func(t *testing.T) { tornTail(t, kind, true) })
			t.Run("ENOSPC at append", func(t *testing.T) { diskFull(t, kind, 0) })
			t.Run("ENOSPC at segment rotation", func(t *testing.T) { diskFull(t, kind, durabilitySegment/2) })
			t.Run("restart at a segment rotation", func(t *testing.T) { restartAtRotation(t, kind) })
			t.Run("fsync error", func(t *testing.T) { fsyncError(t, kind) })
		})
	}
}

// TestDurabilityChild is the process killDuringAppends kills: it appends
// to the log store named by LEASEHOLD_DURABILITY_CHILD (kind:dir) until
// killed, printing each acknowledged index.
func TestDurabilityChild(t *testing.T) {
	spec := os.Getenv("LEASEHOLD_DURABILITY_CHILD")
	if spec == "" {
		t.Skip("the child of TestLogStoreDurability")
	}
	kind, dir, _ := strings.Cut(spec, ":")
	walSegmentSize = durabilitySegment
	s, _, err := openStore(dir, kind)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	for i := uint64(1); ; i += 8 {
		if err := appendEntries(s, i, i+7, 8); err != nil {
			fmt.Fprintln(w, "error", err)
			w.Flush()
			os.Exit(1)
		}
		fmt.Fprintln(w, "acked", i+7)
		w.Flush()
	}
}

// killDuringAppends: a process appending in a loop is killed (SIGKILL)
// once it acknowledged 400 entries, in the middle of its next appends;
// reopened, the log holds every acknowledged entry and continues.
func killDuringAppends(t *testing.T, kind string) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDurabilityChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LEASEHOLD_DURABILITY_CHILD="+kind+":"+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "acked" {
			acked, _ = strconv.ParseUint(f[1], 10, 64)
			if acked >= 400 {
				break
			}
		} else if len(f) > 0 && f[0] == "error" {
			t.Fatalf("the child: %s", sc.Text())
		}
	}
	// The child goes on appending (its pipe is not read: it blocks on
	// a full pipe at worst, between appends) until the kill.
	cmd.Process.Signal(syscall.SIGKILL)
	go io.Copy(io.Discard, out)
	cmd.Wait()
	if acked < 400 {
		t.Fatalf("the child acknowledged %d entries before it ended", acked)
	}
	s, closeFn, err := openStore(dir, kind)
	if err != nil {
		t.Fatalf("reopen after kill -9: %v", err)
	}
	defer closeFn()
	last := checkRecovered(t, s, acked)
	t.Logf("acknowledged %d, the log holds 1-%d after the kill: recovers", acked, last)
}

// lastFile is the file a store wrote last: raft.db, or raft-wal's newest
// segment.
func lastFile(t *testing.T, dir, kind string) string {
	t.Helper()
	if kind == LogStoreBoltDB {
		return filepath.Join(dir, "raft.db")
	}
	segs, err := filepath.Glob(filepath.Join(dir, walDir, "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment files: %v", err)
	}
	return segs[len(segs)-1] // names sort by base index
}

// dataEnd is the offset after the last non-zero byte of b.
func dataEnd(b []byte) int {
	i := len(b)
	for i > 0 && b[i-1] == 0 {
		i--
	}
	return i
}

// boltNewestMeta is the offset of the meta page (0 or 1) a bbolt file
// holds with the higher transaction id, and the page size.
func boltNewestMeta(t *testing.T, b []byte) (int, int) {
	t.Helper()
	// Page header (16 bytes), then the meta: magic (4), version (4),
	// page size (4), flags (4), root bucket (16), freelist (8), pgid (8),
	// txid (8, at 48), checksum.
	const metaOff = 16
	pageSize := int(leUint32(b[metaOff+8:]))
	txid := func(page int) uint64 { return leUint64(b[page*pageSize+metaOff+48:]) }
	if txid(1) > txid(0) {
		return 1 * pageSize, pageSize
	}
	return 0, pageSize
}

func leUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func leUint64(b []byte) uint64 { return uint64(leUint32(b)) | uint64(leUint32(b[4:]))<<32 }

// tornTail: entries 1-200 are appended (the last batch alone), the store
// is closed, and the last write is damaged as a crash in its middle
// leaves it: its last bytes garbled (raft-wal: the end of the last commit
// in the newest segment; bbolt: the newest meta page, the last thing a
// commit writes), or, with truncate, the last file cut short (raft-wal:
// inside the last commit; bbolt: the file loses its last page). The log,
// reopened, must hold 1-199 (the last batch may be lost: a crash before
// its fsync returned never acknowledged it) and continue.
func tornTail(t *testing.T, kind string, truncate bool) {
	dir := t.TempDir()
	s, closeFn, err := openStore(dir, kind)
	if err != nil {
		t.Fatal(err)
	}
	if err := appendEntries(s, 1, 199, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{durabilityEntry(200)}); err != nil {
		t.Fatal(err)
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	path := lastFile(t, dir, kind)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case kind == LogStoreWAL && truncate:
		err = os.Truncate(path, int64(dataEnd(b)-20))
	case kind == LogStoreWAL:
		end := dataEnd(b)
		copy(b[end-20:end], bytes.Repeat([]byte{0xa5}, 20))
		err = os.WriteFile(path, b, 0o600)
	case truncate:
		_, pageSize := boltNewestMeta(t, b)
		err = os.Truncate(path, int64(len(b)-pageSize))
	default:
		meta, pageSize := boltNewestMeta(t, b)
		copy(b[meta+pageSize/2:meta+pageSize], bytes.Repeat([]byte{0xa5}, pageSize/2))
		copy(b[meta+16:meta+80], bytes.Repeat([]byte{0xa5}, 64))
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, closeFn, err = openStore(dir, kind)
	if err != nil {
		t.Fatalf("reopen after a torn tail: %v", err)
	}
	defer closeFn()
	last := checkRecovered(t, s, 199)
	t.Logf("the log holds 1-%d after the damage: recovers", last)
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory (root
// only), unmounted at the end of the test.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("ENOSPC cases need root to mount a small tmpfs: skipped (run the suite as root, e.g. in a container, to get them)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s): skipped", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes dir/ballast until the file system is full, then frees
// about free bytes (a reserve file written first).
func fillDisk(t *testing.T, dir string, free int) {
	t.Helper()
	if free > 0 {
		if err := os.WriteFile(filepath.Join(dir, "reserve"), make([]byte, free), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "ballast"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{1}, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if free > 0 {
		if err := os.Remove(filepath.Join(dir, "reserve")); err != nil {
			t.Fatal(err)
		}
	}
}

// diskFull: the file system fills up (free bytes left) while the store
// appends: it must return an error (not panic, not acknowledge what it
// did not write). Then the ballast goes and the same append is retried
// in the running store (recovers, or wedges: it still fails), then after
// a restart, which must hold every acknowledged entry and continue.
func diskFull(t *testing.T, kind string, free int) {
	fs := mountTmpfs(t, 8<<20)
	dir := filepath.Join(fs, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s, closeFn, err := openStore(dir, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if closeFn != nil {
			closeFn()
		}
	}()
	// Some entries before the disk fills.
	if err := appendEntries(s, 1, 40, 8); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, fs, free)
	acked, next := uint64(40), uint64(41)
	var appendErr error
	for ; next < 40+(8<<20)/512; next += 8 {
		if appendErr = appendEntries(s, next, next+7, 8); appendErr != nil {
			break
		}
		acked = next + 7
	}
	if appendErr == nil {
		t.Fatalf("the store took %d entries on a full disk", next-41)
	}
	t.Logf("append %d on a full disk: %v", next, appendErr)
	// The store may have written part of the failed batch; it must
	// not say so.
	if last, err := s.LastIndex(); err != nil || last != acked {
		t.Fatalf("after the failed append, last index %d, %v; acknowledged %d", last, err, acked)
	}
	if err := os.Remove(filepath.Join(fs, "ballast")); err != nil {
		t.Fatal(err)
	}
	// One entry: a batch could fill raft-wal's segment, whose rotation
	// then races with the close below (see restartAtRotation).
	retry := appendEntries(s, next, next, 1)
	if retry == nil {
		acked = next
		t.Logf("with space again the running store takes the append: recovers by itself")
	} else {
		// Several more tries: a wedge stays.
		for range 3 {
			if retry = appendEntries(s, next, next, 1); retry == nil {
				break
			}
		}
		t.Logf("with space again the running store still fails: %v", retry)
	}
	wantRetry := durabilityOutcome[kind][fmt.Sprintf("enospc-%d", free)]
	if got := outcome(retry); got != wantRetry {
		t.Errorf("%s, ENOSPC (free %d): the running store %s after space came back, documented as %s", kind, free, got, wantRetry)
	}
	if err := closeFn(); err != nil {
		t.Logf("close: %v", err)
	}
	closeFn = nil
	s, closeFn, err = openStore(dir, kind)
	if err != nil {
		t.Fatalf("restart after the disk was full: %v", err)
	}
	last := checkRecovered(t, s, acked)
	t.Logf("after a restart the log holds 1-%d (acknowledged %d) and continues", last, acked)
}

// outcome names what a store did once a fault was gone.
func outcome(retry error) string {
	if retry == nil {
		return "recovers"
	}
	if errors.Is(retry, raftwal.ErrSealed) {
		return "wedges (segment is sealed)"
	}
	return "wedges"
}

// durabilityOutcome is what each store does once the disk has space
// again (docs/operations.md). bbolt fails the transaction and takes the
// next one. raft-wal fails an append whose write into its segment meets
// ENOSPC and takes the next one (on tmpfs, where the segment's
// preallocation did not reserve its space; where it does, a full disk
// meets raft-wal only at a rotation); but when the next segment cannot be
// created at a rotation, the full segment stays the tail, sealed, and
// every later append returns ErrSealed, space or not, until a restart.
// For bbolt the rotation case is one more full disk at an append: it has
// no segments.
var durabilityOutcome = map[string]map[string]string{
	LogStoreBoltDB: {"enospc-0": "recovers", fmt.Sprintf("enospc-%d", durabilitySegment/2): "recovers"},
	LogStoreWAL:    {"enospc-0": "recovers", fmt.Sprintf("enospc-%d", durabilitySegment/2): "wedges (segment is sealed)"},
}

// sealingEntries is how many durabilityEntry entries, appended 8 at a
// time, fill a raft-wal segment of durabilitySegment bytes: the append
// that brings the log to it seals the segment.
const sealingEntries = 240

// restartAtRotation: the server stops (or crashes) right after the append
// that filled raft-wal's segment, before the next segment was created
// (raft-wal creates it in the background once the append returned, and
// skips it when the log closes first). raft-wal wrote the segment's index
// (it is sealed in the file) but its metadata still has it as the tail:
// reopened, it takes it for the tail, and every append fails with
// "segment is sealed", after every restart. The way out is the offline
// move to raft.db (MigrateLog), which reads it. bbolt has no segments:
// the same appends, stop and restart recover.
func restartAtRotation(t *testing.T, kind string) {
	var dir string
	for try := 0; ; try++ {
		if try == 20 {
			t.Skip("raft-wal created the next segment before every one of 20 closes: the state was not reached")
		}
		dir = t.TempDir()
		s, closeFn, err := openStore(dir, kind)
		if err != nil {
			t.Fatal(err)
		}
		if err := appendEntries(s, 1, sealingEntries, 8); err != nil {
			t.Fatal(err)
		}
		if err := closeFn(); err != nil {
			t.Fatal(err)
		}
		if kind == LogStoreBoltDB {
			break
		}
		segs, _ := filepath.Glob(filepath.Join(dir, walDir, "*.wal"))
		if len(segs) == 1 {
			break // closed before the rotation
		}
	}
	s, closeFn, err := openStore(dir, kind)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	retry := appendEntries(s, sealingEntries+1, sealingEntries+1, 1)
	closeFn()
	want := map[string]string{LogStoreBoltDB: "recovers", LogStoreWAL: "wedges (segment is sealed)"}[kind]
	if got := outcome(retry); got != want {
		t.Fatalf("%s, restart at a rotation: %s (%v), documented as %s", kind, got, retry, want)
	}
	t.Logf("the append after the restart: %v: %s", retry, want)
	if retry == nil {
		s, closeFn, err := openStore(dir, kind)
		if err != nil {
			t.Fatal(err)
		}
		defer closeFn()
		checkRecovered(t, s, sealingEntries+1)
		return
	}
	// Another restart does not help; the move to raft.db does.
	s, closeFn, err = openStore(dir, kind)
	if err != nil {
		t.Fatal(err)
	}
	if err := appendEntries(s, sealingEntries+1, sealingEntries+1, 1); !errors.Is(err, raftwal.ErrSealed) {
		t.Fatalf("the append after a second restart: %v", err)
	}
	closeFn()
	res, err := MigrateLog(dir, LogStoreBoltDB, nil)
	if err != nil {
		t.Fatalf("move the wedged log to raft.db: %v", err)
	}
	s, closeFn, err = openStore(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	last := checkRecovered(t, s, sealingEntries)
	t.Logf("moved to raft.db (%+v): the log holds 1-%d and continues", res, last)
}

// failingLogs fails appends while fail is set, without passing them on:
// a store whose fsync fails returns the error and does not count the
// entries (bbolt does not commit the transaction; raft-wal rolls its
// segment writer back to before the append).
type failingLogs struct {
	raft.LogStore
	fail     atomic.Bool
	failures atomic.Int64
}

func (f *failingLogs) StoreLogs(ls []*raft.Log) error {
	if f.fail.Load() {
		f.failures.Add(1)
		return errors.New("injected: fsync: input/output error")
	}
	return f.LogStore.StoreLogs(ls)
}

func (f *failingLogs) StoreLog(l *raft.Log) error { return f.StoreLogs([]*raft.Log{l}) }

// fsyncError: a single server whose log appends fail (an fsync error
// after the write) loses leadership and answers the writes with errors;
// once appends succeed again it leads and commits again, and a restart
// replays every write it acknowledged. The injection sits above the store
// (WrapStores): it shows what Raft does with the error, which is the same
// for both stores; what either store does with a real fsync error
// underneath is not simulated (bbolt has no file-system hook).
func fsyncError(t *testing.T, kind string) {
	dir := t.TempDir()
	var fl *failingLogs
	wrap := func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
		fl = &failingLogs{LogStore: l}
		return fl, s
	}
	f := &countFSM{}
	c, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: kind, WrapStores: wrap}, f)
	if err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	for range 20 {
		if err := c.raft.Apply([]byte("x"), 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	fl.fail.Store(true)
	err = c.raft.Apply([]byte("y"), 5*time.Second).Error()
	if err == nil {
		t.Fatal("a write whose append failed was acknowledged")
	}
	t.Logf("the write whose append failed: %v", err)
	fl.fail.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := c.raft.Apply([]byte("z"), 5*time.Second).Error(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write succeeded within 30s once appends worked again (%d failures)", fl.failures.Load())
		}
	}
	if err := c.raft.Barrier(5 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	applied := f.n.Load()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	replay(t, dir, applied)
	t.Logf("%d failed appends, then the server led again; a restart replays all %d commands", fl.failures.Load(), applied)
}
