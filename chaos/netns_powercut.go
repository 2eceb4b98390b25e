//go:build linux

package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/leasehold/leasehold/chaos/lazyfs"
)

// Power cuts: with NetnsOptions.LazyDisk each node's data directory is a
// lazy filesystem (chaos/lazyfs) over Dir/data/nI: what the server wrote
// but did not fsync is kept apart, and PowerCut drops it after killing the
// server, as a power loss does. A SIGKILL alone keeps it (the page cache
// survives a process), so only a cut proves that an acknowledged write was
// on disk.

// mountLazy mounts every node's lazy filesystem (none without LazyDisk).
// The server's --data-dir is the mount, Dir/lazy/nI.
func (c *NetnsCluster) mountLazy() error {
	if !c.opts.LazyDisk {
		return nil
	}
	if err := lazyfs.Supported(); err != nil {
		return fmt.Errorf("chaos: power cuts: %v: %w", err, ErrUnsupported)
	}
	// The mounts sit in a shared mount of their own: `ip netns exec`
	// gives each server a copy of the mount table, as a slave of this
	// one, so an unmount here (a cut) leaves the servers' copies too and
	// the FUSE connection ends. (The root mount may be private.)
	root := filepath.Join(c.opts.Dir, "lazy")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("chaos: bind %s: %w", root, err)
	}
	c.lazyRoot = root
	if err := syscall.Mount("", root, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("chaos: make %s shared: %w", root, err)
	}
	for _, n := range c.nodes {
		backing := n.data
		mnt := filepath.Join(root, n.id)
		for _, d := range []string{backing, mnt} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("chaos: %w", err)
			}
		}
		fs, err := lazyfs.Mount(backing, mnt)
		if err != nil {
			return fmt.Errorf("chaos: lazy disk for %s: %w", n.id, err)
		}
		n.lazy, n.data = fs, mnt
		c.log.Info("data directory on a lazy filesystem", "node", n.id, "dir", mnt, "backing", backing)
	}
	return nil
}

// unmountLazy unmounts what mountLazy mounted, keeping what the servers
// wrote (a clean shutdown: the nodes have stopped).
func (c *NetnsCluster) unmountLazy() error {
	var errs []error
	for _, n := range c.nodes {
		if n.lazy == nil {
			continue
		}
		if err := n.lazy.Close(); err != nil {
			errs = append(errs, fmt.Errorf("chaos: lazy disk of %s: %w", n.id, err))
		}
		n.data, n.lazy = n.lazy.Backing(), nil
	}
	if c.lazyRoot != "" {
		if err := syscall.Unmount(c.lazyRoot, 0); err != nil {
			if lerr := syscall.Unmount(c.lazyRoot, syscall.MNT_DETACH); lerr != nil {
				errs = append(errs, fmt.Errorf("chaos: unmount %s: %w", c.lazyRoot, err))
			}
		}
		c.lazyRoot = ""
		if err := os.RemoveAll(filepath.Join(c.opts.Dir, "lazy")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PowerCut cuts node i's power: its server is killed (SIGKILL) and every
// write it had not fsynced is lost. It returns how many bytes were lost.
// Restart brings the node back. ErrUnsupported without
// NetnsOptions.LazyDisk.
func (c *NetnsCluster) PowerCut(i int) (int64, error) {
	n, err := c.node(i)
	if err != nil {
		return 0, err
	}
	if n.lazy == nil {
		return 0, fmt.Errorf("chaos: %s has no lazy disk (NetnsOptions.LazyDisk): %w", n.id, ErrUnsupported)
	}
	if err := n.kill(); err != nil {
		return 0, err
	}
	lost, err := n.lazy.Cut()
	c.log.Info("power cut", "node", n.id, "unsynced_bytes_lost", lost, "err", err)
	if err != nil {
		return lost, fmt.Errorf("chaos: power cut of %s: %w", n.id, err)
	}
	return lost, nil
}
