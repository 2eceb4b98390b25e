//go:build linux

package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The netns tier's clock and disk-stall faults: a node's chaos fault file
// (clockFault), which a server built with the chaos tag reads.

// clockFault is a node's chaos fault file (node/clock_chaos.go): its
// clock, and its disk (node/disk_chaos.go).
type clockFault struct {
	WallOffsetNS int64   `json:"wall_offset_ns"`
	MonoRate     float64 `json:"mono_rate"`
	DiskStall    bool    `json:"disk_stall,omitempty"`
	DiskDelayNS  int64   `json:"disk_delay_ns,omitempty"`
}

// ClockJump adds d to node i's wall-clock offset. The binary must be built
// with the `chaos` tag: ErrUnsupported once a node's log shows it started
// without the chaos clock (ClockJump(i, 0) is a cheap probe). While no node
// has got that far, the file is written and nil returned.
func (c *NetnsCluster) ClockJump(i int, d time.Duration) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.WallOffsetNS += int64(d)
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("clock jump", "node", c.NodeID(i), "by", d, "offset", time.Duration(f.WallOffsetNS))
	return nil
}

// ClockRate sets node i's monotonic clock rate (1 is normal; 0.5 to 2 are
// sane, anything not positive is refused). ErrUnsupported as ClockJump.
func (c *NetnsCluster) ClockRate(i int, r float64) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	if !(r > 0) || r > 100 {
		return fmt.Errorf("chaos: clock rate %v: want 0 < r <= 100", r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.MonoRate = r
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("clock rate", "node", c.NodeID(i), "rate", r)
	return nil
}

// DiskFault stalls or slows node i's Raft store writes through its chaos
// fault file (the binary must have the `chaos` tag; ErrUnsupported as
// ClockJump). A node picks a change up within about 20 ms.
func (c *NetnsCluster) DiskFault(i int, stall bool, delay time.Duration) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	if delay < 0 {
		return fmt.Errorf("chaos: disk delay %v: want >= 0", delay)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.DiskStall, f.DiskDelayNS = stall, int64(delay)
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("disk fault", "node", c.NodeID(i), "stall", stall, "delay", delay)
	return nil
}

// Markers in a node's log: the server's start line, and the warning a
// binary built with the `chaos` tag logs before it when
// LEASEHOLD_CHAOS_CLOCK is set (node/clock_chaos.go).
const (
	serverStartedMarker = "server started"
	chaosClockMarker    = "chaos clock active"
	startHeader         = "==== chaos: starting "
)

// clockSupportLocked returns ErrUnsupported if the binary has no chaos
// clock: some node's log, since its last start, has the server's start
// line without the chaos clock's warning. Undecided (no node has started
// that far) is nil. The answer is kept once known.
func (c *NetnsCluster) clockSupportLocked() error {
	if c.clockKnown {
		if !c.clockOK {
			return fmt.Errorf("chaos: %s was built without the chaos tag (no %q in its logs): %w", c.opts.Binary, chaosClockMarker, ErrUnsupported)
		}
		return nil
	}
	for _, n := range c.nodes {
		b, err := os.ReadFile(n.log)
		if err != nil {
			continue
		}
		if k := bytes.LastIndex(b, []byte(startHeader)); k >= 0 {
			b = b[k:]
		}
		switch {
		case bytes.Contains(b, []byte(chaosClockMarker)):
			c.clockKnown, c.clockOK = true, true
		case bytes.Contains(b, []byte(serverStartedMarker)):
			c.clockKnown, c.clockOK = true, false
		default:
			continue
		}
		return c.clockSupportLocked()
	}
	return nil
}

// writeClockLocked writes node i's clock file atomically (temp + rename).
func (c *NetnsCluster) writeClockLocked(i int, f clockFault) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	path := c.nodes[i].clock
	tmp, err := os.CreateTemp(filepath.Dir(path), ".clock-*")
	if err != nil {
		return fmt.Errorf("chaos: clock file: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("chaos: clock file: %w", werr)
	}
	c.clocks[i] = f
	return nil
}

// ClockPath is node i's clock fault file (LEASEHOLD_CHAOS_CLOCK).
func (c *NetnsCluster) ClockPath(i int) string { return c.nodes[i].clock }
