package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/fsm"
)

// applyBuckets are the upper bounds (seconds) of the apply latency histogram.
var applyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

type counters struct {
	acquired, renewed, released, expired, revoked atomic.Uint64
	sessCreated, sessHeartbeats, lateHeartbeats   atomic.Uint64
	sessExpired                                   atomic.Uint64

	mu         sync.Mutex
	applyCount []uint64
	applySum   float64
	applyN     uint64
}

func newCounters() *counters { return &counters{applyCount: make([]uint64, len(applyBuckets))} }

func (c *counters) countEvents(evs []hubEvent) {
	for _, e := range evs {
		switch e.Type {
		case fsm.EventAcquired:
			c.acquired.Add(1)
		case fsm.EventRenewed:
			c.renewed.Add(1)
		case fsm.EventReleased:
			c.released.Add(1)
		case fsm.EventExpired:
			c.expired.Add(1)
		case fsm.EventRevoked:
			c.revoked.Add(1)
		case fsm.EventSessionCreated:
			c.sessCreated.Add(1)
		case fsm.EventSessionHeartbeat:
			c.sessHeartbeats.Add(1)
		case fsm.EventSessionEnded:
			if e.Session != nil && e.Session.State == fsm.SessionExpired {
				c.sessExpired.Add(1)
			}
		}
	}
}

func (c *counters) observeApply(d time.Duration) {
	s := d.Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range applyBuckets {
		if s <= b {
			c.applyCount[i]++
		}
	}
	c.applySum += s
	c.applyN++
}
