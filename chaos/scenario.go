package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Scenario is one chaos experiment: a cluster size, a nemesis schedule run
// beside the workloads, and what must have happened for the run to count
// (effectiveness).
type Scenario struct {
	Name string
	Doc  string
	// Nodes is the cluster size (default 5).
	Nodes int
	// Class is the nemesis class the scenario covers (partition, loss,
	// latency, crash, pause, clock, disk, transfer, membership, snapshot,
	// wipe, restore, none).
	Class string
	// Nemesis runs after the warm-up and must heal whatever it broke
	// before it returns.
	Nemesis func(ctx context.Context, e *Env) error
	// SnapshotThreshold, if > 0, makes nodes snapshot and compact after
	// that many log entries (snapshot pressure).
	SnapshotThreshold int
	// DiskMiB, if > 0, gives every node a data directory of its own of
	// that many MiB (the netns tier: a tmpfs each; the in-process tier
	// cannot, and skips the scenario), and MinFreeDiskMiB is then the
	// servers' --min-free-disk.
	DiskMiB, MinFreeDiskMiB int
	// PowerCut puts every node's data directory on a lazy filesystem
	// (the netns tier; the in-process tier cannot, and skips the
	// scenario), so that the nemesis can cut a node's power: what it
	// wrote and did not fsync is lost.
	PowerCut bool
	// LazyDisk puts every node's data directory on a lazy filesystem as
	// PowerCut does, for the disk-error scenarios (the filesystem fails
	// writes and fsyncs on demand); the in-process tier skips them.
	LazyDisk bool
	// RaftLog is the servers' --raft-log (Raft's log store: "boltdb" or
	// "wal"); empty: the servers' default.
	RaftLog string
	// Expect lists effectiveness counters and their minimum (e.g.
	// "leader-changes": 1, "snapshots-installed": 1).
	Expect map[string]int
	// Eps overrides the TTL safety fraction (clock-rate scenarios).
	Eps float64
	// Liveness adds the liveness checker (CheckLiveness): with a healthy
	// majority, the cluster clock never stands still longer than
	// StallBound.
	Liveness bool
	// StallBound is the scenario's liveness bound (default LivenessBound):
	// generous, so that a busy machine never fails a sound run, and still
	// far below a clock that stopped.
	StallBound time.Duration
	// Configuration adds the configuration checker (CheckConfiguration):
	// one leader per term, one voter change at a time.
	Configuration bool
}

// stallBound is the liveness bound of s's runs.
func (s *Scenario) stallBound() time.Duration {
	if s.StallBound > 0 {
		return s.StallBound
	}
	return LivenessBound
}

func (s *Scenario) nodes() int {
	if s.Nodes == 0 {
		return 5
	}
	return s.Nodes
}

// Scenarios lists the built-in scenarios by name.
func Scenarios() []*Scenario {
	out := append([]*Scenario(nil), builtin...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FindScenario returns the named scenario.
func FindScenario(name string) (*Scenario, error) {
	for _, s := range builtin {
		if s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("chaos: no scenario %q (leasehold-chaos --list names them)", name)
}
