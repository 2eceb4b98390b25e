//go:build linux

package lazyfs

import (
	"bytes"
	"fmt"
	"os"
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

// A bbolt database (mmap reads, pwrite and fdatasync writes) keeps every
// committed transaction across a cut, and one opened with NoSync loses
// what it committed since its last sync but is consistent after the cut.
func TestBolt(t *testing.T) {
	f := mount(t)
	for _, noSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("nosync=%v", noSync), func(t *testing.T) {
			p := filepath.Join(f.Mountpoint(), fmt.Sprintf("db-%v", noSync))
			db, err := bolt.Open(p, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			put := func(from, to int) {
				t.Helper()
				for i := from; i < to; i++ {
					err := db.Update(func(tx *bolt.Tx) error {
						b, err := tx.CreateBucketIfNotExists([]byte("b"))
						if err != nil {
							return err
						}
						return b.Put(fmt.Appendf(nil, "k%05d", i), pattern(300, byte(i)))
					})
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			put(0, 200) // synced
			// Neither the commits' syncs nor those of the file's growth.
			db.NoSync, db.NoGrowSync = noSync, noSync
			put(200, 400)
			// A kill leaves the files as they are: no close, no sync. Drop
			// the handle without bbolt's Close (which would not sync either,
			// but unmaps cleanly): close the file under it.
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			cut(t, f)
			db, err = bolt.Open(p, 0o600, nil)
			if err != nil {
				t.Fatalf("reopen after the cut: %v", err)
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
			if err != nil {
				t.Fatal(err)
			}
			want := 400
			if noSync {
				want = 200
			}
			if n != want {
				t.Fatalf("%d keys after the cut, want %d", n, want)
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
	w, err := raftwal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 300; i++ {
		if err := w.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: pattern(200, byte(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	w, err = raftwal.Open(dir)
	if err != nil {
		t.Fatalf("reopen after the cut: %v", err)
	}
	defer w.Close()
	last, err := w.LastIndex()
	if err != nil || last != 300 {
		t.Fatalf("last index after the cut: %d, %v; want 300", last, err)
	}
	var l raft.Log
	if err := w.GetLog(300, &l); err != nil || !bytes.Equal(l.Data, pattern(200, 44)) {
		t.Fatalf("entry 300 after the cut: %v", err)
	}
}
