package chaos

// lossCounter is a Cluster that counts what its loss faults did (both
// tiers): the loss scenario's effect.
type lossCounter interface {
	LossHits() (int64, error)
}

// LossHits is how many dials, stream writes and gossip packets the loss
// faults refused, held back or dropped since the cluster started.
func (c *InprocCluster) LossHits() (int64, error) {
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	return c.net.lost, nil
}
