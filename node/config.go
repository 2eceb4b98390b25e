package node

import (
	"cmp"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/internal/option"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures one node. Start from DefaultConfig. A numeric field
// left zero means its default (DefaultConfig's value); a negative one turns
// the setting off or lifts the limit where the field says so, and is
// invalid elsewhere (the package doc's rule).
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
	// GossipAddr is the memberlist bind address (UDP and TCP). Default
	// "127.0.0.1:7702". With InMemory the port is ignored (an ephemeral
	// one is used).
	GossipAddr string
	// AdvertiseAddr is the host or IP the other servers reach this one at,
	// for Raft and gossip (and HTTP when HTTPAddr's host is unspecified). A
	// host name is resolved once, at Open. Empty: the bind addresses, which
	// must then not be unspecified (0.0.0.0).
	AdvertiseAddr string
	// HTTPAddr is advertised to peers (followers forward requests to the
	// leader's) and shown in cluster status; the node itself does not serve
	// HTTP. Default "127.0.0.1:7700".
	HTTPAddr string
	// Join lists gossip addresses of members to contact (any of them is
	// enough). A new server (no Raft state) that is not forming a cluster
	// (BootstrapExpect <= 1) must reach one within JoinTimeout.
	Join []string
	// JoinTimeout bounds how long a new server keeps trying Join before Open
	// fails. Default 60s; negative: one attempt.
	JoinTimeout time.Duration
	// BootstrapExpect is the number of servers to wait for before forming a
	// new cluster: once that many new servers with the same setting see
	// each other through gossip, each bootstraps the same configuration. 0
	// or 1 bootstraps a single-node cluster at once when there is no state
	// and nothing to Join. A server with Raft state never bootstraps.
	BootstrapExpect int
	// DeadServerTimeout, if positive, lets the leader remove a server that
	// gossip has seen failed (or left) for that long, never going below
	// MinQuorum voters nor removing a majority. Default off (0, or
	// negative): only an operator removes servers.
	DeadServerTimeout time.Duration
	// MinQuorum is the fewest voters automatic removal leaves. Default 3.
	MinQuorum int
	// StabilizationTime is how long a new server must be healthy before
	// it is promoted from non-voter to voter. Default 2s; negative: at once.
	StabilizationTime time.Duration
	// GossipKey, if set, encrypts gossip (16, 24 or 32 bytes; every server
	// needs the same key).
	GossipKey []byte
	// SealKey is the cluster's sealing key (32 bytes, the same on every
	// server, kept apart from the data directory): the idempotency hash and
	// the key that seals an idempotent acquire's token are HMACs under it,
	// so the log, snapshots and backups reveal no idempotency key or token
	// without it. nil: derived from GossipKey when that is set; else the
	// unkeyed legacy scheme (whoever has a backup can test guessed
	// idempotency keys offline). See seal.go.
	SealKey []byte
	// SealKeyRotate lets this server, as leader, record its sealing key's
	// check value over a different one (a key rotation). Without it a
	// server whose key does not match the recorded check refuses to serve.
	// Default false.
	SealKeyRotate bool
	// GrantKey is this server's grant signing key (Ed25519; package
	// grant), never replicated. nil: the key in DataDir/grant.key, made at
	// first start (mode 0600); with InMemory a new key per process.
	GrantKey ed25519.PrivateKey
	// GrantKeyRetention is how long the key set (GET /v1/keys) lists a
	// key after it was retired (a rotation, or its server removed), by
	// the cluster clock, so that grants it signed before still verify.
	// Every server should have the same. Default 24h; negative: retired
	// keys are not listed.
	GrantKeyRetention time.Duration
	// RaftTLS, if set, runs Raft traffic over mutual TLS: every peer must
	// present a certificate from RaftTLS.CAs (see cluster.TLSConfig). nil:
	// plain TCP. Ignored with InMemory.
	RaftTLS *cluster.TLSConfig

	// TickPeriod is the cluster clock's resolution: the leader commits one
	// tick per period. Every TTL is rounded up to whole ticks and a lease
	// is due within two ticks after its TTL (it ends then, or in a storm
	// with its expiry chunk right after). Default 100ms; 10ms-10s.
	TickPeriod time.Duration
	// Retention is how long terminal leases and sessions stay readable, in
	// ticks of TickPeriod. Default 1h.
	Retention time.Duration
	// MinTTL and MaxTTL bound lease and session TTLs. Defaults 1s and 24h.
	MinTTL, MaxTTL time.Duration
	// ControlMaxTTL bounds the control lease's TTL where the leader
	// grants it, whatever the node that took the request allowed (the
	// WebSocket's own bound, api.ControlOptions.MaxTTL, is checked first).
	// Default (and when 0) DefaultControlMaxTTL; at most MaxTTL.
	ControlMaxTTL time.Duration
	// MaxWait bounds wait_ms. Default 5m; negative: no waiting (wait_ms
	// must be 0).
	MaxWait time.Duration
	// MaxLockDelay bounds lock_delay_ms. Default 1h; negative: no lock
	// delay (lock_delay_ms must be 0).
	MaxLockDelay time.Duration
	// EventHistory is how many recent events are kept in memory for stream
	// resumption. Default 100000.
	EventHistory int
	// SnapshotThreshold is how many log entries since the last snapshot
	// trigger a new one. Default 8192.
	SnapshotThreshold uint64
	// SnapshotInterval is how often the threshold is checked. Default 30s.
	SnapshotInterval time.Duration
	// StateCheckInterval is how often the leader compares the state of
	// every server (statecheck.go): a server whose state differs from the
	// majority's takes itself out of service. A server also compares
	// itself with a majority of the servers when it starts. Default 5
	// minutes; negative turns both off.
	StateCheckInterval time.Duration
	// TrailingLogs is how many log entries a snapshot leaves in the log
	// for followers that lag; a follower further behind is sent the
	// snapshot instead. Default 10240 (Raft's).
	TrailingLogs uint64
	// ApplyTimeout bounds how long a write may wait to be handed to Raft;
	// a write that has not committed within twice this is reported
	// INDETERMINATE. Default 10s.
	ApplyTimeout time.Duration
	// MaxBatch bounds how many operations share one log entry. Default 1024.
	MaxBatch int
	// ApplyStallTimeout: a follower whose applied index has not advanced
	// for this long while the cluster went on (stall.go) is frozen: not
	// ready (ReadyErr, /readyz), and leasehold_apply_stalled is 1.
	// Default (and 0) 5s.
	ApplyStallTimeout time.Duration

	// Count limits, each negative for none. They travel in the commands that
	// create leases and sessions and are enforced when the command is
	// applied, so concurrent requests cannot overshoot them; a request over
	// one is RESOURCE_EXHAUSTED naming the limit (429 over HTTP) and
	// changes nothing. Every server should have the same values: a
	// request is held to the limits of the server that proposes it (the
	// leader, as followers forward writes).
	//
	// MaxLeases bounds the cluster's live leases: active ones plus queued
	// acquires. Default 1,000,000.
	MaxLeases int
	// MaxLeasesPerHolder bounds one holder's active leases. Default 100,000.
	MaxLeasesPerHolder int
	// MaxSessions bounds the cluster's active sessions. Default 100,000.
	MaxSessions int
	// MaxSessionsPerHolder bounds one holder's active sessions. Default 1,000.
	MaxSessionsPerHolder int
	// MaxWaitersPerKey bounds the queued acquires (wait_ms) of one key,
	// MaxWaitersPerHolder those of one holder. Default 10,000 each.
	MaxWaitersPerKey    int
	MaxWaitersPerHolder int
	// MaxRetained bounds the ended leases and sessions kept for Retention:
	// beyond it the ones that ended first are pruned early, so churn cannot
	// grow memory and snapshots without limit. With chunked pruning a tick
	// prunes at most a chunk (4,096: about 40,000 a second at the default
	// period) and none of the current tick's: ends faster than that stay
	// above the bound until pruning catches up.
	// It travels in the leader's ticks. Default 1,000,000.
	MaxRetained int
	// MaxEventStreams bounds the event subscriptions open on this node at
	// once (each HTTP event stream is one). Default 1024.
	MaxEventStreams int
	// MinFreeDisk is the free-space guard's threshold in bytes: while the
	// filesystem of DataDir has less free, or a voter reports through
	// gossip that its own has, the leader refuses writes that grow the
	// state (acquire, session create) before proposing them, with
	// RESOURCE_EXHAUSTED (field "min_free_disk"); renewals, heartbeats,
	// releases and revokes go on. Free space is read every second.
	// 0 (default): max(DefaultMinFreeDisk (256 MiB), twice the latest
	// snapshot), which covers one more log segment (64 MiB) and a
	// snapshot. Negative: off.
	MinFreeDisk int64
	// MemoryLimit is the memory, in bytes, that a restore's admission
	// check holds its estimate to (see Node.RestoreSnapshot): the
	// process's hard bound, GOMEMLIMIT or its memory cgroup's limit (the
	// server sets it). 0 (default): the machine's physical memory.
	// Negative: no memory check.
	MemoryLimit int64
	// SkipRestore is the id of a restore ("rs_...") whose commit this
	// server applies as a refusal that changes nothing: the way out of a
	// committed restore that the servers cannot apply (they run out of
	// memory or disk on it, and restart into it again). Replicas stay
	// identical only when every server has it and none has applied that
	// commit (see docs/operations.md). Empty (default): none.
	SkipRestore string
	// LogFailureTimeout: once every write to Raft's log store has failed
	// for this long, the node fails (Node.Failed; the server exits with
	// status 74 for its supervisor to restart it). It fails sooner when
	// the disk has room again and the log still refuses writes (raft-wal's
	// sealed segment after a failed rotation never recovers in-process).
	// 0: DefaultLogFailureTimeout (60s). Negative: only the disk's room
	// coming back fails it.
	LogFailureTimeout time.Duration
	// InMemory keeps log, stable store and snapshots in memory and uses an
	// in-memory transport (tests only: a crash loses everything).
	InMemory bool
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// Registry, if set, is the Prometheus registry the node registers its
	// metrics in (Node.Registry); nil: a registry of its own. Never share
	// one between nodes.
	Registry *prometheus.Registry

	// Custom networks, for embedders that route, shape or observe the
	// traffic between servers themselves (the chaos suite injects faults
	// through them). Nil: plain TCP and UDP.
	//
	// WrapRaftStream wraps Raft's stream layer (every connection Raft
	// accepts on RaftAddr or dials to a peer), whatever layer is in use.
	// The node-to-node streams of the same port (DialPeer, ServePeer) are
	// told apart beneath it and do not pass through it: do not rely on it
	// to authenticate servers (RaftTLS does, for both).
	WrapRaftStream func(raft.StreamLayer) raft.StreamLayer
	// WrapRaftTransport wraps Raft's transport (the network transport,
	// above the stream layer; with InMemory the in-memory one): every RPC
	// this server sends (appends, votes, snapshots). It must pass every
	// call on.
	WrapRaftTransport func(raft.Transport) raft.Transport
	// WrapGossip wraps memberlist's transport (UDP packets and TCP streams
	// on GossipAddr).
	WrapGossip func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// RaftLog is the Raft log store of a new data dir: "boltdb" (the log
	// in raft.db) or "wal" (in wal/, raft-wal); empty: cluster's
	// DefaultLogStore. An existing data dir keeps its store: a RaftLog that
	// is not the directory's fails Open (see cluster.Config.LogStore).
	RaftLog string
	// WALSegmentSize is the segment size in bytes of a raft-wal log
	// (cluster.Config.WALSegmentSize): for tests; 0, the default, is
	// raft-wal's 64 MiB.
	WALSegmentSize int
	// WrapRaftStores wraps Raft's log and stable stores, for embedders and
	// tests that inject storage faults or observe writes. The stores it
	// returns must pass every call on.
	WrapRaftStores func(raft.LogStore, raft.StableStore) (raft.LogStore, raft.StableStore)

	// Version is this build's version, gossiped to the other servers and
	// shown in cluster status and metrics; empty: "dev".
	Version string

	// RaftTimeout, if positive, is Raft's heartbeat and election timeout
	// (the leader lease is half of it). 0: 500ms, tuned for a LAN. Lower
	// values fail over faster on a quiet network and lose leaders to
	// scheduling stalls on a busy machine.
	RaftTimeout time.Duration
	// FastGossip shortens gossip's probe and suspicion times (100ms probes)
	// for small clusters on one machine.
	FastGossip bool

	// testHooks are the package's own tests' hooks (testhooks.go); zero
	// in every other use.
	testHooks
}

// DefaultConfig returns a single-node configuration on loopback with data in
// ./leasehold-data.
func DefaultConfig() Config {
	return Config{
		NodeID:             "node1",
		DataDir:            "./leasehold-data",
		RaftAddr:           "127.0.0.1:7701",
		GossipAddr:         "127.0.0.1:7702",
		HTTPAddr:           "127.0.0.1:7700",
		BootstrapExpect:    1,
		JoinTimeout:        time.Minute,
		MinQuorum:          3,
		StabilizationTime:  2 * time.Second,
		TickPeriod:         100 * time.Millisecond,
		Retention:          time.Hour,
		MinTTL:             time.Second,
		MaxTTL:             24 * time.Hour,
		ControlMaxTTL:      DefaultControlMaxTTL,
		MaxWait:            5 * time.Minute,
		MaxLockDelay:       time.Hour,
		EventHistory:       100000,
		SnapshotThreshold:  8192,
		SnapshotInterval:   30 * time.Second,
		StateCheckInterval: 5 * time.Minute,
		ApplyTimeout:       10 * time.Second,
		MaxBatch:           1024,
		ApplyStallTimeout:  DefaultApplyStallTimeout,
		GrantKeyRetention:  24 * time.Hour,

		MaxLeases:            1_000_000,
		MaxLeasesPerHolder:   100_000,
		MaxSessions:          100_000,
		MaxSessionsPerHolder: 1_000,
		MaxEventStreams:      1024,
		MaxWaitersPerKey:     10_000,
		MaxWaitersPerHolder:  10_000,
		MaxRetained:          1_000_000,
	}
}

// Validate reports every problem with the configuration at once (nil:
// none), its zero fields read as their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.NodeID == "" {
		errs = append(errs, errors.New("node id is required"))
	}
	if c.DataDir == "" && !c.InMemory {
		errs = append(errs, errors.New("data dir is required"))
	}
	if c.RaftLog != "" && c.RaftLog != cluster.LogStoreBoltDB && c.RaftLog != cluster.LogStoreWAL {
		errs = append(errs, fmt.Errorf("raft log store %q: want %s or %s", c.RaftLog, cluster.LogStoreBoltDB, cluster.LogStoreWAL))
	}
	if c.WALSegmentSize != 0 && (c.WALSegmentSize < cluster.MinWALSegmentSize || c.WALSegmentSize > cluster.MaxWALSegmentSize) {
		errs = append(errs, fmt.Errorf("raft-wal segment size %d: want 0 (raft-wal's default) or %d-%d bytes",
			c.WALSegmentSize, cluster.MinWALSegmentSize, cluster.MaxWALSegmentSize))
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
	if c.ControlMaxTTL < 0 {
		errs = append(errs, fmt.Errorf("control max TTL %v is negative", c.ControlMaxTTL))
	}
	if c.EventHistory < 1 {
		errs = append(errs, errors.New("event history must be at least 1"))
	}
	if c.ApplyTimeout <= 0 {
		errs = append(errs, errors.New("apply timeout must be positive"))
	}
	if c.ApplyStallTimeout < 0 {
		errs = append(errs, errors.New("apply stall timeout must not be negative (0: the default)"))
	}
	if c.MaxBatch < 1 || c.MaxBatch > 4096 {
		errs = append(errs, fmt.Errorf("max batch %d outside 1-4096", c.MaxBatch))
	}
	if c.BootstrapExpect < 0 {
		errs = append(errs, errors.New("bootstrap expect must not be negative"))
	}
	if c.BootstrapExpect > 9 {
		errs = append(errs, fmt.Errorf("bootstrap expect %d: more than 9 voters only slows every write down; use 3 or 5", c.BootstrapExpect))
	}
	if c.BootstrapExpect > 1 && len(c.Join) == 0 {
		errs = append(errs, errors.New("bootstrap expect > 1 needs join addresses of the other servers"))
	}
	if c.GossipAddr == "" {
		errs = append(errs, errors.New("gossip address is required"))
	}
	if c.RaftTimeout < 0 {
		errs = append(errs, errors.New("raft timeout must not be negative"))
	}
	if c.MinQuorum < 1 {
		errs = append(errs, errors.New("min quorum must be at least 1"))
	}
	switch len(c.GossipKey) {
	case 0, 16, 24, 32:
	default:
		errs = append(errs, fmt.Errorf("gossip key is %d bytes; want 16, 24 or 32", len(c.GossipKey)))
	}
	if len(c.SealKey) != 0 && len(c.SealKey) != SealKeyBytes {
		errs = append(errs, fmt.Errorf("seal key is %d bytes; want %d", len(c.SealKey), SealKeyBytes))
	}
	if c.GrantKey != nil && len(c.GrantKey) != ed25519.PrivateKeySize {
		errs = append(errs, fmt.Errorf("grant key is %d bytes; want an Ed25519 private key (%d)", len(c.GrantKey), ed25519.PrivateKeySize))
	}
	if c.RaftTLS != nil && (c.RaftTLS.Certificate == nil || c.RaftTLS.CAs == nil) {
		errs = append(errs, errors.New("raft TLS needs both a certificate and a CA pool"))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with every zero numeric field set to
// DefaultConfig's value and every negative "off" or "no limit" set to 0,
// which the code reads as none. Open runs the node on it. Fields whose
// code reads zero as the default itself (MinFreeDisk, MemoryLimit,
// LogFailureTimeout, ApplyStallTimeout, ControlMaxTTL, RaftTimeout,
// TrailingLogs, BootstrapExpect) are left as they are; a negative value
// of a field that cannot be turned off is left for Validate to refuse.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.JoinTimeout = option.OrNone(c.JoinTimeout, d.JoinTimeout)
	c.DeadServerTimeout = max(c.DeadServerTimeout, 0)
	c.StabilizationTime = option.OrNone(c.StabilizationTime, d.StabilizationTime)
	c.GrantKeyRetention = option.OrNone(c.GrantKeyRetention, d.GrantKeyRetention)
	c.StateCheckInterval = option.OrNone(c.StateCheckInterval, d.StateCheckInterval)
	c.MaxWait = option.OrNone(c.MaxWait, d.MaxWait)
	c.MaxLockDelay = option.OrNone(c.MaxLockDelay, d.MaxLockDelay)
	c.MaxLeases = option.OrNone(c.MaxLeases, d.MaxLeases)
	c.MaxLeasesPerHolder = option.OrNone(c.MaxLeasesPerHolder, d.MaxLeasesPerHolder)
	c.MaxSessions = option.OrNone(c.MaxSessions, d.MaxSessions)
	c.MaxSessionsPerHolder = option.OrNone(c.MaxSessionsPerHolder, d.MaxSessionsPerHolder)
	c.MaxWaitersPerKey = option.OrNone(c.MaxWaitersPerKey, d.MaxWaitersPerKey)
	c.MaxWaitersPerHolder = option.OrNone(c.MaxWaitersPerHolder, d.MaxWaitersPerHolder)
	c.MaxRetained = option.OrNone(c.MaxRetained, d.MaxRetained)
	c.MaxEventStreams = option.OrNone(c.MaxEventStreams, d.MaxEventStreams)
	c.MinQuorum = cmp.Or(c.MinQuorum, d.MinQuorum)
	c.TickPeriod = cmp.Or(c.TickPeriod, d.TickPeriod)
	c.Retention = cmp.Or(c.Retention, d.Retention)
	c.MinTTL = cmp.Or(c.MinTTL, d.MinTTL)
	c.MaxTTL = cmp.Or(c.MaxTTL, d.MaxTTL)
	c.EventHistory = cmp.Or(c.EventHistory, d.EventHistory)
	c.SnapshotThreshold = cmp.Or(c.SnapshotThreshold, d.SnapshotThreshold)
	c.SnapshotInterval = cmp.Or(c.SnapshotInterval, d.SnapshotInterval)
	c.ApplyTimeout = cmp.Or(c.ApplyTimeout, d.ApplyTimeout)
	c.MaxBatch = cmp.Or(c.MaxBatch, d.MaxBatch)
	return c
}

// version is Version, or "dev" when unset.
func (c *Config) version() string {
	if c.Version == "" {
		return "dev"
	}
	return c.Version
}

// SealKeyBytes is the length of a sealing key.
const SealKeyBytes = 32

// DefaultApplyStallTimeout is the default of Config.ApplyStallTimeout.
const DefaultApplyStallTimeout = 5 * time.Second
