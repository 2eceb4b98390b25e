package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
)

// Config configures the Raft side of a server.
type Config struct {
	// NodeID is this server's Raft id.
	NodeID string
	// Dir holds raft.db (the stable store; its lock keeps a second server
	// off the directory; the log too with LogStoreBoltDB), wal/ (the log
	// with LogStoreWAL) and snapshots/.
	Dir string
	// LogStore is the Raft log store of a new data dir: LogStoreBoltDB or
	// LogStoreWAL; empty: DefaultLogStore. An existing directory keeps the
	// store it has: a LogStore that is not the directory's fails Open,
	// naming both (MigrateLog moves a log, offline).
	LogStore string
	// WALSegmentSize is the size in bytes of the segment files of a log
	// kept by raft-wal (LogStoreWAL); 0: raft-wal's own, 64 MiB. For
	// tests that need a segment rotation within a few MiB of writes;
	// otherwise 0 (or MinWALSegmentSize..MaxWALSegmentSize).
	WALSegmentSize int
	// BindAddr is the TCP address the Raft transport listens on.
	BindAddr string
	// Advertise is the address peers dial; empty means BindAddr. A host
	// name (it must resolve at start) stays the Raft address the others
	// record and dial, resolved again on every dial; an IP is taken as
	// it is.
	Advertise string
	// InMemory uses in-memory stores and transport (tests only).
	InMemory bool
	// Bootstrap forms a new single-server cluster when there is no existing
	// Raft state. A server with existing state never bootstraps again.
	Bootstrap bool
	// SnapshotThreshold and SnapshotInterval: see raft.Config.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// TrailingLogs kept after a snapshot. Default 10240.
	TrailingLogs uint64
	// HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout: Raft timing,
	// tuned for a LAN. Defaults 500ms, 500ms, 250ms.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// StallTimeout bounds how long a Raft message this server has started
	// to receive may go without a byte arriving: then the connection is
	// dropped (stall.go), freeing a follower whose leader vanished in the
	// middle of sending a snapshot. Connections idle between messages are
	// never timed. Zero: 10 × HeartbeatTimeout (5 s by default); negative:
	// no limit. Not used with InMemory.
	StallTimeout time.Duration
	// Logger receives Raft's logs.
	Logger *slog.Logger
	// TLS, if set, runs Raft traffic over mutual TLS (see TLSConfig);
	// nil: plain TCP.
	TLS *TLSConfig
	// BeforeStart, if set, runs once the stores are open (and a single
	// server bootstrapped), before Raft starts: hadState tells whether Raft
	// state existed, addr is the address the others dial. An error stops
	// Open.
	BeforeStart func(hadState bool, addr string) error
	// LogEnd, if set, is told the last index of the stored log before Raft
	// starts: entries up to it that Raft applies are the startup's replay.
	LogEnd func(last uint64)
	// SnapshotOpened, if set, is told the metadata of every snapshot Raft
	// opens, before it reads it: Raft opens the snapshot it restores into
	// the state machine just before it calls Restore (at startup, and on a
	// follower a leader sent one; a leader also opens the snapshots it
	// sends, and a snapshot future's Open the one it took).
	SnapshotOpened func(meta raft.SnapshotMeta)
	// WrapStream, if set, wraps the Raft stream layer (every connection
	// Raft accepts or dials) for embedders that route, shape or observe
	// the traffic between servers themselves. It gets the layer in use
	// and returns the one Raft uses; Addr must still be the address peers
	// dial. Not used with InMemory. The node-to-node streams (PeerListener,
	// DialPeer) are told apart beneath it, by the identity layer, and do
	// not pass through it.
	WrapStream func(raft.StreamLayer) raft.StreamLayer
	// WrapStores, if set, wraps Raft's log and stable stores (fault
	// injection: see internal/diskfault). Reads and writes must reach the
	// stores it is given.
	WrapStores func(raft.LogStore, raft.StableStore) (raft.LogStore, raft.StableStore)
	// WrapTransport, if set, wraps Raft's transport (every RPC this
	// server sends: appends, votes, snapshots), for tests that duplicate,
	// delay or observe Raft's messages. The transport it returns must pass
	// every call on, and keep the optional methods Raft looks for
	// (RequestPreVote, Close). With InMemory it wraps the in-memory
	// transport: Transport returns the wrapper, so peers are connected
	// through it only if it keeps raft.WithPeers too, and a wrapper handed to
	// another server's Connect must have Unwrap() raft.Transport, or
	// connecting it panics in Raft.
	WrapTransport func(raft.Transport) raft.Transport
	// Identity, if set, makes every Raft connection start with an exchange
	// of cluster ids (see Identity): servers of two clusters never
	// exchange Raft traffic. It wraps the TLS or TCP layer, inside
	// WrapStream. Not used with InMemory.
	Identity *Identity
	// Members, if set, owns this server's membership (members*.go): gossip
	// starts before Raft (after BeforeStart), and the identity exchange
	// is Members' unless Identity is set.
	Members *Members
}

// ErrInvalidConfig wraps configuration problems found by Validate.
var ErrInvalidConfig = errors.New("cluster: invalid config")

// DefaultConfig is a Config with every default filled in; NodeID and
// either Dir or InMemory remain to be set.
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		LeaderLeaseTimeout: 250 * time.Millisecond,
		TrailingLogs:       10240,
	}
}

// Validate returns every problem of the configuration at once (each wraps
// ErrInvalidConfig), or nil. A zero duration or count means its default.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.NodeID == "" {
		bad("node id is required")
	}
	if !c.InMemory && c.Dir == "" {
		bad("a data directory is required (or InMemory)")
	}
	for name, d := range map[string]time.Duration{"heartbeat timeout": c.HeartbeatTimeout,
		"election timeout": c.ElectionTimeout, "leader lease timeout": c.LeaderLeaseTimeout,
		"snapshot interval": c.SnapshotInterval} {
		if d < 0 {
			bad("%s must not be negative, got %v", name, d)
		}
	}
	if !c.InMemory && c.LogStore != "" && c.LogStore != LogStoreBoltDB && c.LogStore != LogStoreWAL {
		bad("raft log store %q: want %s or %s", c.LogStore, LogStoreBoltDB, LogStoreWAL)
	}
	if c.WALSegmentSize != 0 && (c.WALSegmentSize < MinWALSegmentSize || c.WALSegmentSize > MaxWALSegmentSize) {
		bad("raft-wal segment size %d: want 0 (raft-wal's default) or %d-%d bytes", c.WALSegmentSize, MinWALSegmentSize, MaxWALSegmentSize)
	}
	return errors.Join(errs...)
}

// withDefaults fills the zero fields of c from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, d.HeartbeatTimeout)
	c.ElectionTimeout = cmp.Or(c.ElectionTimeout, d.ElectionTimeout)
	c.LeaderLeaseTimeout = cmp.Or(c.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	c.TrailingLogs = cmp.Or(c.TrailingLogs, d.TrailingLogs)
	c.StallTimeout = cmp.Or(c.StallTimeout, 10*c.HeartbeatTimeout)
	return c
}

// raftConfig is hashicorp/raft's configuration for c.
func (c Config) raftConfig(notify chan bool) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = 256
	rc.BatchApplyCh = true
	rc.TrailingLogs = c.TrailingLogs
	if c.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = c.SnapshotThreshold
	}
	if c.SnapshotInterval > 0 {
		rc.SnapshotInterval = c.SnapshotInterval
	}
	rc.NotifyCh = notify
	rc.Logger = newHCLogger("raft", c.Logger)
	return rc
}
