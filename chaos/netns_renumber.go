//go:build linux

package chaos

import (
	"fmt"
	"strconv"
)

// Renumber kills node i, adds a new IP to its namespace's eth0 (10.77.K.
// 100+10r+i+1 at its r-th renumbering) and starts it again with its Raft
// and gossip on that IP; its API stays on its first address, where the
// harness's clients reach it, and its old Raft and gossip ports are closed.
// It returns the new Raft address.
func (c *NetnsCluster) Renumber(i int) (string, error) {
	n, err := c.node(i)
	if err != nil {
		return "", err
	}
	if err := n.kill(); err != nil {
		return "", err
	}
	n.mu.Lock()
	r := n.renumbered + 1
	n.mu.Unlock()
	if 100+10*r+i+1 > 254 {
		return "", fmt.Errorf("chaos: node %d renumbered too often", i)
	}
	ip := fmt.Sprintf("10.77.%d.%d", c.subnet, 100+10*r+i+1)
	if err := c.run("ip", "-n", n.ns, "addr", "add", ip+"/24", "dev", "eth0"); err != nil {
		return "", err
	}
	n.mu.Lock()
	n.peer, n.renumbered = ip, r
	n.mu.Unlock()
	c.log.Info("renumber", "node", n.id, "raft_ip", ip)
	return ip + ":" + strconv.Itoa(netnsRaftPort), n.start()
}
