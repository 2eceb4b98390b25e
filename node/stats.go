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
	// Counted here, added once each: a storm's batch has thousands.
	var acquired, renewed, released, expired, revoked, sessCreated, sessHeartbeats, sessExpired uint64
	for i := range evs {
		e := &evs[i]
		switch e.Type {
		case fsm.EventAcquired:
			acquired++
		case fsm.EventRenewed:
			renewed++
		case fsm.EventReleased:
			released++
		case fsm.EventExpired:
			expired++
		case fsm.EventRevoked:
			revoked++
		case fsm.EventSessionCreated:
			sessCreated++
		case fsm.EventSessionHeartbeat:
			sessHeartbeats++
		case fsm.EventSessionEnded:
			if e.Session != nil && e.Session.State == fsm.SessionExpired {
				sessExpired++
			}
		}
	}
	for _, a := range []struct {
		n *atomic.Uint64
		d uint64
	}{{&c.acquired, acquired}, {&c.renewed, renewed}, {&c.released, released}, {&c.expired, expired},
		{&c.revoked, revoked}, {&c.sessCreated, sessCreated}, {&c.sessHeartbeats, sessHeartbeats}, {&c.sessExpired, sessExpired}} {
		if a.d > 0 {
			a.n.Add(a.d)
		}
	}
}

func (c *counters) observeApply(d time.Duration, n int) {
	s := d.Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range applyBuckets {
		if s <= b {
			c.applyCount[i] += uint64(n)
		}
	}
	c.applySum += s * float64(n)
	c.applyN += uint64(n)
}
