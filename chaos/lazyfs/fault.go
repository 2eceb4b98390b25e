//go:build linux

package lazyfs

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Disk errors: SetError makes every write, fsync and fallocate fail with
// an errno until SetError(0), as a full disk (ENOSPC) or a failing one
// (EIO) answers them. A failed call changes nothing: a write's data is not
// taken, and what was unsynced stays unsynced (a later fsync that succeeds
// makes it durable; Linux may instead forget the pages a failed fsync did
// not write, which this model does not do). With ENOSPC the filesystem
// also reports no free space (statfs), as a full disk does; with EIO it
// reports the backing directory's, as a disk that fails with room left.
// Reads, and the namespace (create, rename, unlink), go on working.

// faultState is the error in force and how many calls it failed.
type faultState struct {
	errno  atomic.Uint32 // 0: none
	failed atomic.Int64
}

// SetError makes writes, fsyncs and fallocates fail with errno (0: they
// work again).
func (f *FS) SetError(errno syscall.Errno) { f.fault.errno.Store(uint32(errno)) }

// Failed is how many calls the errors set by SetError have failed, in
// total: proof that the program using the filesystem hit them.
func (f *FS) Failed() int64 { return f.fault.failed.Load() }

// injected returns the errno a data call must fail with (counting it), or 0.
func (f *FS) injected() syscall.Errno {
	e := syscall.Errno(f.fault.errno.Load())
	if e != 0 {
		f.fault.failed.Add(1)
	}
	return e
}

var _ fs.NodeStatfser = (*node)(nil)

// Statfs reports the backing directory's filesystem, with no free space
// while writes fail with ENOSPC.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := n.LoopbackNode.Statfs(ctx, out); errno != 0 {
		return errno
	}
	if syscall.Errno(n.fs.fault.errno.Load()) == syscall.ENOSPC {
		out.Bfree, out.Bavail = 0, 0
	}
	return 0
}
