//go:build linux

package chaos

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
)

// Disk errors on the real-process tier: with NetnsOptions.LazyDisk, node
// i's lazy filesystem fails every write, fsync and fallocate with ENOSPC
// or EIO while DiskError says so (chaos/lazyfs SetError).

// DiskError makes node i's data directory fail writes and fsyncs with
// errno ("ENOSPC", "EIO"; "": they work again). ErrUnsupported without
// NetnsOptions.LazyDisk.
func (c *NetnsCluster) DiskError(i int, errno string) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	if n.lazy == nil {
		return fmt.Errorf("chaos: %s has no lazy disk (NetnsOptions.LazyDisk): %w", n.id, ErrUnsupported)
	}
	var e syscall.Errno
	switch errno {
	case "":
	case "ENOSPC":
		e = syscall.ENOSPC
	case "EIO":
		e = syscall.EIO
	default:
		return fmt.Errorf("chaos: disk error %q: want ENOSPC, EIO or none", errno)
	}
	n.lazy.SetError(e)
	c.log.Info("disk error", "node", n.id, "errno", errno, "failed_so_far", n.lazy.Failed())
	return nil
}

// DiskErrorsHit is how many of node i's filesystem calls the errors set by
// DiskError have failed so far.
func (c *NetnsCluster) DiskErrorsHit(i int) int64 {
	n, err := c.node(i)
	if err != nil || n.lazy == nil {
		return 0
	}
	return n.lazy.Failed()
}

// ExitStatus is the exit status of node i's last start once it has exited
// (-1 while it runs, or when it was killed by a signal).
func (c *NetnsCluster) ExitStatus(i int) int {
	n, err := c.node(i)
	if err != nil || n.alive() {
		return -1
	}
	n.mu.Lock()
	werr := n.err
	n.mu.Unlock()
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		return ee.ExitCode()
	}
	if werr == nil {
		return 0
	}
	return -1
}
