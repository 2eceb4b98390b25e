package cluster

import "golang.org/x/sys/unix"

// unmapPages drops the pages of the n bytes of a file mapping at addr from
// this process's page tables (madvise MADV_DONTNEED). For a shared file
// mapping nothing is lost: the data stays in the file and the page cache,
// and the next read of a page maps it again (a minor fault). The caller
// keeps the mapping in place while this runs.
func unmapPages(addr uintptr, n int64) error {
	if n <= 0 {
		return nil
	}
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, uintptr(n), unix.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
