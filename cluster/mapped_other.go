//go:build !linux

package cluster

// unmapPages does nothing where MADV_DONTNEED is not known to keep a
// shared file mapping's data (see mapped_linux.go).
func unmapPages(addr uintptr, n int64) error { return nil }
