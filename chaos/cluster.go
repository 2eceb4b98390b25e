package chaos

import (
	"context"
	"errors"
	"time"
)

// ErrUnsupported is returned by a Cluster for a fault it cannot inject (an
// in-process cluster cannot SIGSTOP a node, for example). A scenario that
// needs such a fault is skipped on that tier and says so in its summary.
var ErrUnsupported = errors.New("chaos: fault not supported by this cluster")

// Cluster is what the workloads talk to and the nemeses act on. Two
// implementations exist: real `leasehold server` processes, each in its own
// network namespace (netns*.go), and in-process nodes on loopback with a
// fault-injecting Raft stream layer and memberlist transport (inproc*.go).
//
// Nodes are numbered 0..Size()-1. Every method is safe for concurrent use
// and returns once the fault is in force (or has been removed).
type Cluster interface {
	// Size is the number of nodes the cluster was started with.
	Size() int
	// NodeID is node i's --node-id.
	NodeID(i int) string
	// HTTPAddr is node i's API address (host:port) as the harness's own
	// clients reach it. Stable across restarts of the node.
	HTTPAddr(i int) string

	// Partition cuts the cluster into groups: nodes in different groups
	// cannot exchange Raft, gossip or HTTP traffic. Nodes not named in any
	// group are alone. The harness's clients still reach every node.
	// Partition replaces any earlier partition or one-way block.
	Partition(groups [][]int) error
	// Block drops traffic from node `from` to node `to` only (one way).
	// Blocks add up until Heal.
	Block(from, to int) error
	// IsolateClient makes node i unreachable from the harness's clients
	// while it keeps talking to its peers.
	IsolateClient(i int) error
	// Loss drops the given fraction (0..1) of node i's traffic to peers.
	Loss(i int, fraction float64) error
	// Delay adds d to every message node i sends to its peers.
	Delay(i int, d time.Duration) error
	// Heal removes every network fault above.
	Heal() error

	// Kill stops node i at once (SIGKILL for a process): no graceful
	// shutdown, data directory left as it is.
	Kill(i int) error
	// Restart starts a killed node again on the same data directory and
	// addresses, and returns once its process (or node) is up; it need not
	// be ready.
	Restart(i int) error
	// Wipe kills node i and deletes its data directory. Restart then starts
	// it empty under the same id.
	Wipe(i int) error
	// Pause freezes node i (SIGSTOP); Resume thaws it (SIGCONT).
	Pause(i int) error
	Resume(i int) error

	// ClockJump moves node i's wall clock by d (negative: back). ClockRate
	// makes its monotonic clock run at rate r (1 is normal). Both need a
	// binary built with the `chaos` tag; ErrUnsupported otherwise.
	ClockJump(i int, d time.Duration) error
	ClockRate(i int, r float64) error
	// DiskFault stalls (stall: every write to node i's Raft log and
	// stable store waits until the stall ends, as behind an fsync that
	// does not return) or slows (delay added to each write) node i's
	// disk; DiskFault(i, false, 0) heals it. The netns tier needs a
	// binary built with the `chaos` tag (ErrUnsupported otherwise).
	DiskFault(i int, stall bool, delay time.Duration) error

	// Alive reports whether node i is running (not killed, not wiped).
	Alive(i int) bool
	// LogPath is node i's log file (all of its output, across restarts).
	LogPath(i int) string
	// DataDir is node i's data directory.
	DataDir(i int) string
	// Close stops every node and removes everything the cluster created
	// (namespaces, bridges, nftables tables, proxies, temporary files), but
	// keeps logs and, if keepData, the data directories.
	Close(ctx context.Context, keepData bool) error
}
