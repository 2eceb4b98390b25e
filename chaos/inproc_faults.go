package chaos

import (
	"errors"
	"fmt"
	"time"
)

// The in-process tier's network faults (the fault table its Raft stream
// layer, memberlist transport and front proxies consult), and the faults it
// cannot inject (pauses, clocks) or injects through the disk hook.

// Partition cuts the cluster into groups; nodes in no group are alone.
func (c *InprocCluster) Partition(groups [][]int) error {
	group := make([]int, len(c.ids))
	for i := range group {
		group[i] = -1 - i // alone
	}
	for g, members := range groups {
		if err := c.check(members...); err != nil {
			return err
		}
		for _, i := range members {
			group[i] = g
		}
	}
	f := c.net
	f.mu.Lock()
	f.blocked = map[[2]int]bool{}
	for a := range group {
		for b := range group {
			if a != b && group[a] != group[b] {
				f.blocked[[2]int{a, b}] = true
			}
		}
	}
	f.mu.Unlock()
	f.enforce()
	return nil
}

// Block drops traffic from node `from` to node `to`.
func (c *InprocCluster) Block(from, to int) error {
	if err := c.check(from, to); err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("chaos: cannot block node %d from itself", from)
	}
	c.net.mu.Lock()
	c.net.blocked[[2]int{from, to}] = true
	c.net.mu.Unlock()
	c.net.enforce()
	return nil
}

// Loss drops fraction of node i's traffic to peers (see faultnet.go for
// what that means for a stream).
func (c *InprocCluster) Loss(i int, fraction float64) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !(fraction >= 0 && fraction <= 1) {
		return fmt.Errorf("chaos: loss %v outside 0..1", fraction)
	}
	c.net.mu.Lock()
	c.net.loss[i] = fraction
	c.net.mu.Unlock()
	return nil
}

// Delay holds every write and packet node i sends to peers back by d.
func (c *InprocCluster) Delay(i int, d time.Duration) error {
	if err := c.check(i); err != nil {
		return err
	}
	if d < 0 || d > time.Minute {
		return fmt.Errorf("chaos: delay %v outside 0..1m", d)
	}
	c.net.mu.Lock()
	c.net.delay[i] = d
	c.net.mu.Unlock()
	return nil
}

// IsolateClient closes node i's front proxy: clients get connection
// refused, open client connections are cut.
func (c *InprocCluster) IsolateClient(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	return c.proxies[i].setIsolated(true)
}

// Heal removes every partition, block, loss, delay and client isolation.
func (c *InprocCluster) Heal() error {
	f := c.net
	f.mu.Lock()
	f.blocked = map[[2]int]bool{}
	clear(f.loss)
	clear(f.delay)
	f.mu.Unlock()
	var errs []error
	for _, p := range c.proxies {
		errs = append(errs, p.setIsolated(false))
	}
	return errors.Join(errs...)
}

// Pause is not supported in process.
func (c *InprocCluster) Pause(int) error { return ErrUnsupported }

// Resume is not supported in process.
func (c *InprocCluster) Resume(int) error { return ErrUnsupported }

// ClockJump is not supported in process.
func (c *InprocCluster) ClockJump(int, time.Duration) error { return ErrUnsupported }

// ClockRate is not supported in process.
func (c *InprocCluster) ClockRate(int, float64) error { return ErrUnsupported }

// DiskFault stalls or slows node i's Raft store writes (through
// node.Config.WrapRaftStores).
func (c *InprocCluster) DiskFault(i int, stall bool, delay time.Duration) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.disks[i].Set(stall, delay)
	return nil
}
