//go:build linux

// Package lazyfs is a FUSE filesystem for power-cut faults: a loopback
// over a backing directory that keeps every write a program has not yet
// made durable apart from the backing files, and drops it all at a cut, as
// a disk's volatile cache and the page cache lose it when the power goes.
// It is what Jepsen's LazyFS does, written for the chaos suite's
// real-process tier.
//
// The model, precisely:
//
//   - File contents and sizes are volatile. A write or a truncation is
//     seen at once by every reader (read(2) and mmap alike), but reaches
//     the backing file only when the file is fsynced or fdatasynced (or
//     the filesystem is closed cleanly). A cut forgets every write and
//     truncation since the file's last sync.
//   - The namespace is durable: creating, renaming, linking and removing
//     a file or directory reach the backing directory at once, as on a
//     filesystem that journals its metadata synchronously. So a file
//     created and never synced survives a cut, empty (or with what an
//     earlier sync of it left). This is kinder than ext4 without a
//     directory fsync; it is exactly as strict about data.
//
// A mount serves one program at a time (the chaos tier's one server):
// Cut must only be called once that program has stopped (killed), and it
// remounts the filesystem, so that no page the kernel cached from the
// lost writes survives either.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// pageSize is the unit in which unsynced data is kept.
const pageSize = 4096

// FS is a mounted lazy filesystem.
type FS struct {
	backing string
	mnt     string

	mu       sync.Mutex
	server   *fuse.Server
	conn     uint32              // the FUSE connection's number (fusectl)
	overlays map[uint64]*overlay // by the backing file's inode
	cuts     int
	lost     int64 // bytes of unsynced writes dropped by cuts, in total

	fault faultState // errors set by SetError (fault.go)
}

// Supported reports why this machine cannot mount a lazy filesystem (not
// root, no /dev/fuse, no fusermount), or nil if it can.
func Supported() error {
	if os.Geteuid() != 0 {
		return errors.New("lazyfs: needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("lazyfs: no /dev/fuse: %w", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		if _, err2 := exec.LookPath("fusermount"); err2 != nil {
			return fmt.Errorf("lazyfs: no fusermount3 or fusermount: %w", err)
		}
	}
	return nil
}

// Mount serves the directory backing at mountpoint (both must exist).
func Mount(backing, mountpoint string) (*FS, error) {
	b, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	m, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	f := &FS{backing: b, mnt: m, overlays: make(map[uint64]*overlay)}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return fmt.Errorf("lazyfs: backing directory: %w", err)
	}
	root := &fs.LoopbackRoot{Path: f.backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, fs: f}
	}
	rootNode := root.NewNode(root, nil, "", &st)
	root.RootNode = rootNode
	// No attribute or entry caching: sizes come from the overlays, and
	// they change under the kernel at a cut.
	zero := time.Duration(0)
	srv, err := fs.Mount(f.mnt, rootNode, &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName:     "lazyfs",
			Name:       "lazyfs",
			AllowOther: true,
			// Mount with the mount(2) system call when root, fusermount
			// otherwise.
			DirectMount: true,
		},
	})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", f.mnt, err)
	}
	conn, err := connection(f.mnt)
	if err != nil {
		srv.Unmount()
		return fmt.Errorf("lazyfs: %s: %w", f.mnt, err)
	}
	f.server, f.conn = srv, conn
	return nil
}

// Mountpoint is where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mnt }

// Backing is the directory that holds what is durable.
func (f *FS) Backing() string { return f.backing }

// Cut is a power cut: it forgets every write and truncation not yet
// synced, then mounts the filesystem afresh (no cached page survives).
// The program using the filesystem must have stopped. It returns the
// number of unsynced bytes lost.
func (f *FS) Cut() (int64, error) {
	if err := f.unmount(); err != nil {
		return 0, err
	}
	f.mu.Lock()
	var lost int64
	for _, o := range f.overlays {
		lost += o.drop()
	}
	f.overlays = make(map[uint64]*overlay)
	f.cuts++
	f.lost += lost
	f.mu.Unlock()
	return lost, f.mount()
}

// Close syncs every file's unsynced data to the backing directory (a clean
// shutdown) and unmounts.
func (f *FS) Close() error {
	f.mu.Lock()
	var errs []error
	for _, o := range f.overlays {
		errs = append(errs, o.sync())
	}
	f.mu.Unlock()
	errs = append(errs, f.unmount())
	f.mu.Lock()
	for _, o := range f.overlays {
		o.close()
	}
	f.overlays = make(map[uint64]*overlay)
	f.mu.Unlock()
	return errors.Join(errs...)
}

// Pending is the number of bytes written and not yet synced, over every
// file.
func (f *FS) Pending() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, o := range f.overlays {
		n += o.pending()
	}
	return n
}

func (f *FS) unmount() error {
	f.mu.Lock()
	srv, conn := f.server, f.conn
	f.server = nil
	f.mu.Unlock()
	if srv == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		var err error
		for try := 0; try < 50; try++ {
			// Unmount also waits for the serving loops to end.
			if err = srv.Unmount(); err == nil {
				break
			}
			// EBUSY while a killed program's last file is being released.
			time.Sleep(100 * time.Millisecond)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		// Detach it: the kernel finishes when the last user goes.
		if lerr := syscall.Unmount(f.mnt, syscall.MNT_DETACH); lerr != nil {
			return fmt.Errorf("lazyfs: unmount %s: %v (detach: %v)", f.mnt, err, lerr)
		}
		return abort(conn)
	case <-time.After(unmountWait):
		// Unmounted, but the connection lives on: a copy of the mount in
		// another mount namespace, or a request that never ends. Abort
		// the connection: every request fails and the loops end.
		if err := abort(conn); err != nil {
			return err
		}
		select {
		case <-done:
			return nil
		case <-time.After(unmountWait):
			return fmt.Errorf("lazyfs: %s: the connection did not end after an abort", f.mnt)
		}
	}
}

// unmountWait bounds the wait for a connection to end after an unmount.
const unmountWait = 10 * time.Second

// connection returns the FUSE connection number of the filesystem mounted
// at mnt (its device's minor number: its name in fusectl).
func connection(mnt string) (uint32, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(mnt, &st); err != nil {
		return 0, err
	}
	return unix.Minor(st.Dev), nil
}

// abort aborts FUSE connection conn through fusectl (mounted if need be).
func abort(conn uint32) error {
	const ctl = "/sys/fs/fuse/connections"
	path := filepath.Join(ctl, fmt.Sprint(conn), "abort")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		_ = syscall.Mount("fusectl", ctl, "fusectl", 0, "")
	}
	if err := os.WriteFile(path, []byte("1"), 0o200); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lazyfs: abort connection %d: %w", conn, err)
	}
	return nil
}

// overlayFor returns the overlay of the backing file at path, opening the
// filesystem's own handle to it on first use.
func (f *FS) overlayFor(ino uint64, path string) (*overlay, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.overlays[ino]; ok {
		o.refs++
		return o, nil
	}
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, err
	}
	o := newOverlay(file, fi.Size())
	o.refs = 1
	f.overlays[ino] = o
	return o, nil
}

// release drops a file handle's reference to its overlay; the last one
// closes an overlay that holds nothing unsynced. (One that does stays,
// with its handle on the backing file, which also keeps the inode number
// from being reused, until a sync, a cut or Close.)
func (f *FS) release(ino uint64, o *overlay) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o.refs--
	if o.refs <= 0 && o.pending() == 0 && f.overlays[ino] == o {
		delete(f.overlays, ino)
		o.close()
	}
}

// existing returns the overlay of ino, if any file handle made one.
func (f *FS) existing(ino uint64) *overlay {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.overlays[ino]
}

// node is a loopback node whose regular files' contents and sizes go
// through an overlay.
type node struct {
	fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeOpener    = (*node)(nil)
	_ fs.NodeCreater   = (*node)(nil)
	_ fs.NodeGetattrer = (*node)(nil)
	_ fs.NodeSetattrer = (*node)(nil)
	_ fs.NodeStatxer   = (*node)(nil)
)

func (n *node) backingPath() string {
	return filepath.Join(n.RootData.Path, n.Path(nil))
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	trunc := flags&syscall.O_TRUNC != 0
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags&^syscall.O_TRUNC)
	if errno != 0 {
		return nil, 0, errno
	}
	if n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fh, fuseFlags, 0
	}
	o, err := n.fs.overlayFor(n.StableAttr().Ino, n.backingPath())
	if err != nil {
		fh.(fs.FileReleaser).Release(ctx)
		return nil, 0, fs.ToErrno(err)
	}
	if trunc {
		o.truncate(0)
	}
	return &file{inner: fh, o: o, fs: n.fs, ino: n.StableAttr().Ino}, fuseFlags, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	// O_TRUNC of an existing file is volatile too.
	trunc := flags&syscall.O_TRUNC != 0
	inode, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	o, err := n.fs.overlayFor(inode.StableAttr().Ino, filepath.Join(n.backingPath(), name))
	if err != nil {
		fh.(fs.FileReleaser).Release(ctx)
		return nil, nil, 0, fs.ToErrno(err)
	}
	if trunc {
		o.truncate(0)
	}
	out.Attr.Size = uint64(o.size())
	return inode, &file{inner: fh, o: o, fs: n.fs, ino: inode.StableAttr().Ino}, fuseFlags, 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var inner fs.FileHandle
	if lf, ok := f.(*file); ok {
		inner = lf.inner // fstat: the file may have been unlinked
	}
	if errno := n.LoopbackNode.Getattr(ctx, inner, out); errno != 0 {
		return errno
	}
	if o := n.fs.existing(n.StableAttr().Ino); o != nil {
		out.Attr.Size = uint64(o.size())
		out.Attr.Blocks = (out.Attr.Size + 511) / 512
	}
	return 0
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if errno := n.LoopbackNode.Statx(ctx, nil, flags, mask, out); errno != 0 {
		return errno
	}
	if o := n.fs.existing(n.StableAttr().Ino); o != nil {
		out.Statx.Size = uint64(o.size())
		out.Statx.Blocks = (out.Statx.Size + 511) / 512
	}
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFREG {
		o, err := n.fs.overlayFor(n.StableAttr().Ino, n.backingPath())
		if err != nil {
			return fs.ToErrno(err)
		}
		o.truncate(int64(sz))
		n.fs.release(n.StableAttr().Ino, o)
		in.Valid &^= fuse.FATTR_SIZE
	}
	if errno := n.LoopbackNode.Setattr(ctx, nil, in, out); errno != 0 {
		return errno
	}
	return n.Getattr(ctx, nil, out)
}

// file is an open regular file: reads and writes go to its overlay.
type file struct {
	inner fs.FileHandle // the loopback file (kept for release)
	o     *overlay
	fs    *FS
	ino   uint64
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
)

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.o.readAt(buf, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(buf[:n]), 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.fs.injected(); errno != 0 {
		return 0, errno
	}
	f.o.writeAt(data, off)
	return uint32(len(data)), 0
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := f.fs.injected(); errno != 0 {
		return errno
	}
	return fs.ToErrno(f.o.sync())
}

func (f *file) Flush(ctx context.Context) syscall.Errno { return 0 }

func (f *file) Release(ctx context.Context) syscall.Errno {
	f.fs.release(f.ino, f.o)
	if r, ok := f.inner.(fs.FileReleaser); ok {
		return r.Release(ctx)
	}
	return 0
}

// Allocate (fallocate(2)) grows the file with zeros; punching holes and
// the other modes are not supported.
func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	const keepSize = 0x01 // FALLOC_FL_KEEP_SIZE
	if mode&^keepSize != 0 {
		return syscall.EOPNOTSUPP
	}
	if errno := f.fs.injected(); errno != 0 {
		return errno
	}
	if mode&keepSize == 0 {
		f.o.grow(int64(off + size))
	}
	return 0
}
