package chaos

import (
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/internal/harness"
)

// The in-process tier's process faults: a node closed (kill), reopened on
// its data directory (restart), or wiped.

// Kill cuts node i's traffic, then closes it (see InprocCluster: not a
// crash). Killing a dead node does nothing.
func (c *InprocCluster) Kill(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !c.Alive(i) {
		return nil
	}
	// A process dies with its stalled writes; a node closing normally
	// must have them finish first.
	c.disks[i].Set(false, 0)
	c.net.mu.Lock()
	c.net.dead[i] = true
	c.net.mu.Unlock()
	c.net.enforce()
	c.proxies[i].setUp(false)
	err := c.h.Stop(c.ids[i])
	if errors.Is(err, harness.ErrNotRunning) {
		return nil // killed meanwhile
	}
	if err != nil && !errors.Is(err, raft.ErrRaftShutdown) {
		return fmt.Errorf("chaos: kill %s: %w", c.ids[i], err)
	}
	return nil
}

// Restart opens a killed node again on the same data directory and
// addresses; it returns once the node runs (not necessarily ready).
func (c *InprocCluster) Restart(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	running := c.Alive(i)
	if closed {
		return errors.New("chaos: cluster closed")
	}
	if running {
		return fmt.Errorf("chaos: node %d is running; kill it first", i)
	}
	c.net.mu.Lock()
	c.net.dead[i] = false
	c.net.mu.Unlock()
	if _, err := c.h.Start(i); err != nil {
		c.net.mu.Lock()
		c.net.dead[i] = true
		c.net.mu.Unlock()
		return err
	}
	return nil
}

// Wipe kills node i and deletes its data directory.
func (c *InprocCluster) Wipe(i int) error {
	if err := c.Kill(i); err != nil {
		return err
	}
	if err := os.RemoveAll(c.DataDir(i)); err != nil {
		return fmt.Errorf("chaos: wipe %s: %w", c.ids[i], err)
	}
	return nil
}

// Alive reports whether node i runs.
func (c *InprocCluster) Alive(i int) bool {
	if c.check(i) != nil {
		return false
	}
	_, ok := c.h.Server(c.ids[i])
	return ok
}
