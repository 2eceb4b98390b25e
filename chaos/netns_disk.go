//go:build linux

package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Small disks for the disk-full nemeses: with NetnsOptions.DiskSize each
// node's data directory is a tmpfs of its own (mounted in the root mount
// namespace before the node starts; `ip netns exec` gives the server a
// copy of the mount table, so it sees the same filesystem), and FillDisk
// grows or removes a ballast file in it.

// ballastName is the ballast file in a node's data directory.
const ballastName = "chaos-ballast"

// mountDisks mounts every node's tmpfs (none without DiskSize).
func (c *NetnsCluster) mountDisks() error {
	if c.opts.DiskSize <= 0 {
		return nil
	}
	for _, n := range c.nodes {
		if err := os.MkdirAll(n.data, 0o700); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		if err := c.run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", c.opts.DiskSize), c.prefix+"disk", n.data); err != nil {
			return fmt.Errorf("chaos: tmpfs for %s: %w", n.id, err)
		}
		n.mounted = true
		c.log.Info("data directory on a tmpfs", "node", n.id, "dir", n.data, "bytes", c.opts.DiskSize)
	}
	return nil
}

// unmountDisks unmounts what mountDisks mounted (the nodes have stopped).
func (c *NetnsCluster) unmountDisks() error {
	var errs []error
	for _, n := range c.nodes {
		if !n.mounted {
			continue
		}
		if err := c.run("umount", n.data); err != nil {
			// A process still holding a file: detach it now, the kernel
			// frees it when the last user goes.
			if lerr := c.run("umount", "-l", n.data); lerr != nil {
				errs = append(errs, err)
				continue
			}
		}
		n.mounted = false
	}
	return errors.Join(errs...)
}

func (c *NetnsCluster) run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// FillDisk fills node i's data directory's filesystem until about leave
// bytes are free (a ballast file beside the server's files, grown or
// shrunk); a negative leave removes the ballast. ErrUnsupported without
// NetnsOptions.DiskSize.
func (c *NetnsCluster) FillDisk(i int, leave int64) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	if !n.mounted {
		return fmt.Errorf("chaos: %s has no disk of its own (NetnsOptions.DiskSize): %w", n.id, ErrUnsupported)
	}
	path := filepath.Join(n.data, ballastName)
	if leave < 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chaos: %w", err)
		}
		c.log.Info("disk ballast removed", "node", n.id)
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.data, &st); err != nil {
		return fmt.Errorf("chaos: statfs %s: %w", n.data, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	var have int64
	if fi, err := os.Stat(path); err == nil {
		have = fi.Size()
	}
	size := max(have+free-leave, 0)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	defer f.Close()
	if size < have {
		err = f.Truncate(size)
	}
	// Real pages (tmpfs allocates them as fallocate asks), a MiB at a
	// time: ENOSPC just means the disk is full, which is what was asked
	// (tmpfs undoes a whole fallocate that does not fit).
	for off := have; err == nil && off < size; off += 1 << 20 {
		if err = syscall.Fallocate(int(f.Fd()), 0, off, min(1<<20, size-off)); errors.Is(err, syscall.ENOSPC) {
			err = nil
			break
		}
	}
	if err != nil {
		return fmt.Errorf("chaos: ballast of %s: %w", n.id, err)
	}
	c.log.Info("disk ballast", "node", n.id, "bytes", size, "free_before", free, "leave", leave)
	return nil
}
