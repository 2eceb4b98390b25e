//go:build linux

package chaos

import "fmt"

// Reidentify kills node i, wipes its data directory and starts it again,
// empty, under a new --node-id (its id with a "b" added), at the same
// addresses: another server in the old one's place. It returns the new id.
func (c *NetnsCluster) Reidentify(i int) (string, error) {
	if err := c.Wipe(i); err != nil {
		return "", err
	}
	n := c.nodes[i]
	n.mu.Lock()
	old := n.id
	if n.renamed != "" {
		old = n.renamed
	}
	n.renamed = old + "b"
	id := n.renamed
	n.mu.Unlock()
	c.log.Info("reidentify", "node", old, "new_id", id)
	if err := n.start(); err != nil {
		return id, fmt.Errorf("chaos: start %s as %s: %w", old, id, err)
	}
	return id, nil
}
