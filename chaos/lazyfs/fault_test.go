//go:build linux

package lazyfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// SetError fails writes and fsyncs with the errno, counts them, changes
// nothing, and once cleared the file works again: what was written before
// and synced after survives a cut.
func TestSetError(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
		t.Run(errno.Error(), func(t *testing.T) {
			f := mount(t)
			path := filepath.Join(f.Mountpoint(), "log")
			fh, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			before := pattern(5000, 1)
			if _, err := fh.WriteAt(before, 0); err != nil {
				t.Fatal(err)
			}
			var st syscall.Statfs_t
			if err := syscall.Statfs(f.Mountpoint(), &st); err != nil || st.Bavail == 0 {
				t.Fatalf("statfs before the fault: %v, %d blocks free", err, st.Bavail)
			}

			f.SetError(errno)
			if _, err := fh.WriteAt(pattern(100, 9), 100); !errors.Is(err, errno) {
				t.Fatalf("write under %v: %v", errno, err)
			}
			if err := fh.Sync(); !errors.Is(err, errno) {
				t.Fatalf("fsync under %v: %v", errno, err)
			}
			if err := syscall.Statfs(f.Mountpoint(), &st); err != nil {
				t.Fatal(err)
			}
			if full := st.Bavail == 0 && st.Bfree == 0; full != (errno == syscall.ENOSPC) {
				t.Fatalf("statfs under %v: %d blocks free, %d available", errno, st.Bfree, st.Bavail)
			}
			got := make([]byte, len(before))
			if _, err := fh.ReadAt(got, 0); err != nil || !bytes.Equal(got, before) {
				t.Fatalf("read under %v: %v; the failed write changed the file: %v", errno, err, !bytes.Equal(got, before))
			}
			if n := f.Failed(); n < 2 {
				t.Fatalf("Failed() = %d after a failed write and a failed fsync", n)
			}

			f.SetError(0)
			if err := fh.Sync(); err != nil {
				t.Fatalf("fsync after the fault: %v", err)
			}
			fh.Close()
			if _, err := f.Cut(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(b, before) {
				t.Fatalf("after a cut: %v, %d bytes (want the %d written before the fault, synced after)", err, len(b), len(before))
			}
		})
	}
}
