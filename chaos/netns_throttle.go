//go:build linux

package chaos

import "fmt"

// Throttle caps what node from sends node to over Raft at bytesPerSec
// (0 removes the cap): a slow link, through the delay proxy of the pair.
// Connections open at the time are reset so that Raft reconnects through
// the proxy. Heal removes it.
func (c *NetnsCluster) Throttle(from, to int, bytesPerSec int64) error {
	if from < 0 || from >= c.opts.Nodes || to < 0 || to >= c.opts.Nodes || from == to || bytesPerSec < 0 {
		return fmt.Errorf("chaos: throttle %d -> %d at %d B/s: want two different nodes of 0..%d and a rate >= 0", from, to, bytesPerSec, c.opts.Nodes-1)
	}
	return c.changeFaults("throttle", func(f *faultState) error { f.rate[from][to] = bytesPerSec; return nil },
		"from", c.NodeID(from), "to", c.NodeID(to), "bytes_per_second", bytesPerSec)
}
