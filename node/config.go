package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config configures one node. Start from DefaultConfig.
type Config struct {
	// NodeID names this server in the Raft configuration. Default "node1".
	NodeID string
	// DataDir holds the Raft log, stable store and snapshots. Required unless
	// InMemory is set. Default "./leasehold-data".
	DataDir string
	// RaftAddr is the TCP address Raft binds. Default "127.0.0.1:7701".
	RaftAddr string
	// RaftAdvertise is the address other servers reach this one at; empty
	// means RaftAddr (which must then not be an unspecified address).
	RaftAdvertise string
	// GossipAddr is the memberlist bind address (used by multi-node
	// clusters). Default "127.0.0.1:7702".
	GossipAddr string
	// HTTPAddr is advertised to peers and shown in cluster status; the node
	// itself does not serve HTTP. Default "127.0.0.1:7700".
	HTTPAddr string
	// Join lists gossip addresses of existing members (multi-node).
	Join []string
	// BootstrapExpect is the number of servers to wait for before forming a
	// new cluster; 0 or 1 bootstraps a single-node cluster at once. Default 1.
	BootstrapExpect int

	// TickPeriod is the cluster clock's resolution: the leader commits one
	// tick per period. Every TTL is rounded up to whole ticks and a lease
	// expires within two ticks after its TTL. Default 100ms; 10ms-10s.
	TickPeriod time.Duration
	// Retention is how long terminal leases and sessions stay readable, in
	// ticks of TickPeriod. Default 1h.
	Retention time.Duration
	// MinTTL and MaxTTL bound lease and session TTLs. Defaults 1s and 24h.
	MinTTL, MaxTTL time.Duration
	// MaxWait bounds wait_ms. Default 5m.
	MaxWait time.Duration
	// MaxLockDelay bounds lock_delay_ms. Default 1h.
	MaxLockDelay time.Duration
	// EventHistory is how many recent events are kept in memory for stream
	// resumption. Default 100000.
	EventHistory int
	// SnapshotThreshold is how many log entries since the last snapshot
	// trigger a new one. Default 8192.
	SnapshotThreshold uint64
	// SnapshotInterval is how often the threshold is checked. Default 30s.
	SnapshotInterval time.Duration
	// ApplyTimeout bounds how long a write may wait to be handed to Raft;
	// a write that has not committed within twice this is reported
	// INDETERMINATE. Default 10s.
	ApplyTimeout time.Duration
	// MaxBatch bounds how many operations share one log entry. Default 1024.
	MaxBatch int
	// InMemory keeps log, stable store and snapshots in memory and uses an
	// in-memory transport (tests only: a crash loses everything).
	InMemory bool
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a single-node configuration on loopback with data in
// ./leasehold-data.
func DefaultConfig() Config {
	return Config{
		NodeID:            "node1",
		DataDir:           "./leasehold-data",
		RaftAddr:          "127.0.0.1:7701",
		GossipAddr:        "127.0.0.1:7702",
		HTTPAddr:          "127.0.0.1:7700",
		BootstrapExpect:   1,
		TickPeriod:        100 * time.Millisecond,
		Retention:         time.Hour,
		MinTTL:            time.Second,
		MaxTTL:            24 * time.Hour,
		MaxWait:           5 * time.Minute,
		MaxLockDelay:      time.Hour,
		EventHistory:      100000,
		SnapshotThreshold: 8192,
		SnapshotInterval:  30 * time.Second,
		ApplyTimeout:      10 * time.Second,
		MaxBatch:          1024,
	}
}

// Validate reports the first problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.NodeID == "" {
		errs = append(errs, errors.New("node id is required"))
	}
	if c.DataDir == "" && !c.InMemory {
		errs = append(errs, errors.New("data dir is required"))
	}
	if c.RaftAddr == "" && !c.InMemory {
		errs = append(errs, errors.New("raft address is required"))
	}
	if c.TickPeriod < 10*time.Millisecond || c.TickPeriod > 10*time.Second {
		errs = append(errs, fmt.Errorf("tick period %v outside 10ms-10s", c.TickPeriod))
	}
	if c.Retention < c.TickPeriod {
		errs = append(errs, fmt.Errorf("retention %v shorter than one tick", c.Retention))
	}
	if c.MinTTL <= 0 || c.MaxTTL < c.MinTTL {
		errs = append(errs, fmt.Errorf("ttl bounds %v-%v invalid", c.MinTTL, c.MaxTTL))
	}
	if c.MaxWait < 0 || c.MaxLockDelay < 0 {
		errs = append(errs, errors.New("max wait and max lock delay must not be negative"))
	}
	if c.EventHistory < 1 {
		errs = append(errs, errors.New("event history must be at least 1"))
	}
	if c.ApplyTimeout <= 0 {
		errs = append(errs, errors.New("apply timeout must be positive"))
	}
	if c.MaxBatch < 1 || c.MaxBatch > 4096 {
		errs = append(errs, fmt.Errorf("max batch %d outside 1-4096", c.MaxBatch))
	}
	if c.BootstrapExpect < 0 {
		errs = append(errs, errors.New("bootstrap expect must not be negative"))
	}
	// Multi-node clusters (gossip discovery, joining) are not built yet:
	// refuse rather than silently run a single node.
	if len(c.Join) > 0 || c.BootstrapExpect > 1 {
		errs = append(errs, errors.New("multi-node clusters (join, bootstrap expect > 1) are not supported by this release; run a single node"))
	}
	return errors.Join(errs...)
}
