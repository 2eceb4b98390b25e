//go:build linux

package chaos

import (
	"fmt"
	"os"
	"path/filepath"
)

// The netns tier's process faults: a node's server process killed,
// restarted, wiped, paused and resumed.

func (c *NetnsCluster) node(i int) (*procNode, error) {
	if i < 0 || i >= len(c.nodes) {
		return nil, fmt.Errorf("chaos: node %d: the cluster has nodes 0..%d", i, len(c.nodes)-1)
	}
	return c.nodes[i], nil
}

// Kill sends SIGKILL to node i and waits for it to exit. Killing a node
// that is not running is not an error.
func (c *NetnsCluster) Kill(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("kill", "node", n.id)
	return n.kill()
}

// Restart starts node i again with the same data directory, addresses and
// flags. It is an error if node i is running.
func (c *NetnsCluster) Restart(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("restart", "node", n.id)
	return n.start()
}

// Wipe kills node i and removes its data directory.
func (c *NetnsCluster) Wipe(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("wipe", "node", n.id, "data", n.data)
	if err := n.kill(); err != nil {
		return err
	}
	if n.mounted || n.lazy != nil {
		// A mount point stays; its contents go.
		entries, err := os.ReadDir(n.data)
		if err != nil {
			return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(n.data, e.Name())); err != nil {
				return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
			}
		}
		return nil
	}
	if err := os.RemoveAll(n.data); err != nil {
		return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
	}
	return nil
}

// Pause freezes node i with SIGSTOP.
func (c *NetnsCluster) Pause(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("pause", "node", n.id)
	_, err = n.pause(true)
	return err
}

// Resume thaws node i with SIGCONT.
func (c *NetnsCluster) Resume(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	was, err := n.pause(false)
	if was {
		c.log.Info("resume", "node", n.id)
	}
	return err
}

// Alive reports whether node i's process is running (a paused one is).
func (c *NetnsCluster) Alive(i int) bool {
	n, err := c.node(i)
	if err != nil {
		return false
	}
	return n.alive()
}
