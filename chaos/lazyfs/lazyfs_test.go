//go:build linux

package lazyfs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	bolt "go.etcd.io/bbolt"
)

// mount mounts a fresh lazy filesystem over a temporary backing directory,
// unmounted (cleanly) at the end of the test.
func mount(t *testing.T) *FS {
	t.Helper()
	if err := Supported(); err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return f
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func writeFile(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func cut(t *testing.T, f *FS) int64 {
	t.Helper()
	lost, err := f.Cut()
	if err != nil {
		t.Fatal(err)
	}
	return lost
}

func TestUnsyncedWriteLostAtCut(t *testing.T) {
	f := mount(t)
	p := filepath.Join(f.Mountpoint(), "a")
	data := pattern(10000, 1)
	writeFile(t, p, data, false)
	if got := readFile(t, p); !bytes.Equal(got, data) {
		t.Fatalf("before the cut: read %d bytes, want the %d written", len(got), len(data))
	}
	if f.Pending() == 0 {
		t.Fatal("an unsynced write is not pending")
	}
	if fi, err := os.Stat(filepath.Join(f.Backing(), "a")); err != nil || fi.Size() != 0 {
		t.Fatalf("the backing file before a sync: %v, %v; want it empty", fi, err)
	}
	if lost := cut(t, f); lost < int64(len(data)) {
		t.Fatalf("cut lost %d bytes, want at least %d", lost, len(data))
	}
	// The name is durable, the data is not.
	if got := readFile(t, p); len(got) != 0 {
		t.Fatalf("after the cut: %d bytes, want none", len(got))
	}
}

func TestSyncedWriteSurvivesCut(t *testing.T) {
	f := mount(t)
	p := filepath.Join(f.Mountpoint(), "a")
	old := pattern(10000, 1)
	writeFile(t, p, old, true)
	// Overwrite the middle without a sync: the cut brings the old bytes back.
	g, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt(pattern(3000, 9), 4000); err != nil {
		t.Fatal(err)
	}
	g.Close()
	if bytes.Equal(readFile(t, p), old) {
		t.Fatal("the overwrite is not visible before the cut")
	}
	cut(t, f)
	if got := readFile(t, p); !bytes.Equal(got, old) {
		t.Fatalf("after the cut: %d bytes, not the synced content", len(got))
	}
}

func TestTruncation(t *testing.T) {
	f := mount(t)
	p := filepath.Join(f.Mountpoint(), "a")
	old := pattern(10000, 1)
	writeFile(t, p, old, true)
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	g, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	tail := pattern(50, 3)
	if _, err := g.WriteAt(tail, 5000); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 5050)
	copy(want, old[:100])
	copy(want[5000:], tail)
	if got := readFile(t, p); !bytes.Equal(got, want) {
		t.Fatalf("truncated and grown: %d bytes, want %d with zeros between", len(got), len(want))
	}
	// Unsynced: the cut restores the whole old file.
	g.Close()
	cut(t, f)
	if got := readFile(t, p); !bytes.Equal(got, old) {
		t.Fatalf("after the cut: %d bytes, want the synced %d", len(got), len(old))
	}
	// The same, synced: it stays, zeros and all.
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	g, err = os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt(tail, 5000); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	cut(t, f)
	if got := readFile(t, p); !bytes.Equal(got, want) {
		t.Fatalf("synced truncation after the cut: %d bytes, want %d", len(got), len(want))
	}
	// O_TRUNC is a truncation like any other.
	writeFile(t, p, nil, false)
	h, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if got := readFile(t, p); len(got) != 0 {
		t.Fatalf("O_TRUNC: %d bytes", len(got))
	}
	cut(t, f)
	if got := readFile(t, p); !bytes.Equal(got, want) {
		t.Fatalf("an unsynced O_TRUNC after the cut: %d bytes, want %d", len(got), len(want))
	}
}

// A file written to a temporary name, synced and renamed (how Raft's
// snapshot store and our own files are written) survives; one renamed
// without its sync is there, empty.
func TestRename(t *testing.T) {
	f := mount(t)
	m := f.Mountpoint()
	data := pattern(9000, 5)
	writeFile(t, filepath.Join(m, "a.tmp"), data, true)
	if err := os.Rename(filepath.Join(m, "a.tmp"), filepath.Join(m, "a")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(m, "b.tmp"), data, false)
	if err := os.Rename(filepath.Join(m, "b.tmp"), filepath.Join(m, "b")); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, filepath.Join(m, "b")), data) {
		t.Fatal("a renamed file lost its unsynced data before the cut")
	}
	cut(t, f)
	if got := readFile(t, filepath.Join(m, "a")); !bytes.Equal(got, data) {
		t.Fatalf("synced then renamed: %d bytes after the cut", len(got))
	}
	if got := readFile(t, filepath.Join(m, "b")); len(got) != 0 {
		t.Fatalf("renamed unsynced: %d bytes after the cut, want none", len(got))
	}
	if _, err := os.Stat(filepath.Join(m, "a.tmp")); !os.IsNotExist(err) {
		t.Fatalf("the temporary name is back: %v", err)
	}
}

// The databases run in a child process (this test binary again): bbolt
// reads its file through mmap, and a page fault on a FUSE mount served by
// the faulting process itself can deadlock with the Go runtime (a thread
// stuck in the fault cannot be stopped for a collection, and the
// collection stops the goroutines that would answer it). The chaos tier's
// servers are other processes too.

func TestMain(m *testing.M) {
	if op := os.Getenv("LAZYFS_TEST_CHILD"); op != "" {
		out, err := child(op, os.Getenv("LAZYFS_TEST_PATH"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(out)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// inChild runs op on path in a child process and returns what it printed.
func inChild(t *testing.T, op, path string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LAZYFS_TEST_CHILD="+op, "LAZYFS_TEST_PATH="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s", op, err, stderr.String())
	}
	return string(out)
}

func child(op, path string) (string, error) {
	switch op {
	case "bolt-sync", "bolt-nosync":
		return "", boltWrite(path, op == "bolt-nosync")
	case "bolt-count":
		n, err := boltCount(path)
		return fmt.Sprint(n), err
	case "wal-write":
		return "", walWrite(path)
	case "wal-check":
		return "", walCheck(path)
	}
	return "", fmt.Errorf("unknown child op %q", op)
}

// boltWrite commits 200 keys with fsync, then 200 more without (noSync)
// or with, and closes the database (which syncs nothing more).
func boltWrite(path string, noSync bool) error {
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	put := func(from, to int) error {
		for i := from; i < to; i++ {
			err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("b"))
				if err != nil {
					return err
				}
				return b.Put(fmt.Appendf(nil, "k%05d", i), pattern(300, byte(i)))
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := put(0, 200); err != nil {
		return err
	}
	// Neither the commits' syncs nor those of the file's growth.
	db.NoSync, db.NoGrowSync = noSync, noSync
	return put(200, 400)
}

// boltCount checks the database's consistency and counts its keys, each
// checked against its value.
func boltCount(path string) (int, error) {
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		return 0, fmt.Errorf("reopen after the cut: %w", err)
	}
	defer db.Close()
	var n int
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		b := tx.Bucket([]byte("b"))
		if b == nil {
			return fmt.Errorf("bucket gone")
		}
		return b.ForEach(func(k, v []byte) error {
			var i int
			if _, err := fmt.Sscanf(string(k), "k%05d", &i); err != nil {
				return err
			}
			if !bytes.Equal(v, pattern(300, byte(i))) {
				return fmt.Errorf("key %s: wrong value", k)
			}
			n++
			return nil
		})
	})
	return n, err
}

func walWrite(dir string) error {
	w, err := raftwal.Open(dir)
	if err != nil {
		return err
	}
	for i := uint64(1); i <= 300; i++ {
		if err := w.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: pattern(200, byte(i))}}); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

func walCheck(dir string) error {
	w, err := raftwal.Open(dir)
	if err != nil {
		return fmt.Errorf("reopen after the cut: %w", err)
	}
	defer w.Close()
	last, err := w.LastIndex()
	if err != nil || last != 300 {
		return fmt.Errorf("last index after the cut: %d, %v; want 300", last, err)
	}
	for i := uint64(1); i <= 300; i++ {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil || !bytes.Equal(l.Data, pattern(200, byte(i))) {
			return fmt.Errorf("entry %d after the cut: %v", i, err)
		}
	}
	return nil
}

// A bbolt database (mmap reads, pwrite and fdatasync writes) keeps every
// committed transaction across a cut, and one that commits without fsync
// loses what it committed since its last sync but is consistent after the
// cut.
func TestBolt(t *testing.T) {
	f := mount(t)
	for _, noSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("nosync=%v", noSync), func(t *testing.T) {
			p := filepath.Join(f.Mountpoint(), fmt.Sprintf("db-%v", noSync))
			op, want := "bolt-sync", "400"
			if noSync {
				op, want = "bolt-nosync", "200"
			}
			inChild(t, op, p)
			cut(t, f)
			if got := inChild(t, "bolt-count", p); got != want {
				t.Fatalf("%s keys after the cut, want %s", got, want)
			}
		})
	}
}

// raft-wal's appends are fsynced: every stored entry survives a cut.
func TestRaftWAL(t *testing.T) {
	f := mount(t)
	dir := filepath.Join(f.Mountpoint(), "wal")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inChild(t, "wal-write", dir)
	cut(t, f)
	inChild(t, "wal-check", dir)
}
