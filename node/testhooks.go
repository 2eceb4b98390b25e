package node

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/fsm"
)

// testHooks are the package's tests' hooks into a node, carried in Config
// (embedded, unexported: no other package sets them, and the zero value,
// every hook off, is what every other use of the node runs with).
type testHooks struct {
	// keepGossipPort keeps an in-memory node's gossip port as configured
	// (an ephemeral one otherwise).
	keepGossipPort bool
	// expireChunk replaces the records a tick or Expire entry ends (0:
	// expireChunk).
	expireChunk uint64
	// lingerMax replaces how long the batcher holds an entry of acquires
	// that will queue, or of ticks of a busy log, for a companion (0:
	// lingerMax).
	lingerMax time.Duration
	// busyLog, if set, replaces whether the batcher finds the log busy
	// (a tick then lingers for a companion: groupCommit.lingers).
	busyLog func() bool
	// renewLinger replaces renewLingerMax and renewGap (how long the
	// batcher holds an entry of renewals for the others of the previous
	// entry's leases).
	renewLinger time.Duration
	// olderPeer makes the leader act as if a server of the configuration
	// ran a version without chunked expiry.
	olderPeer bool
	// corruptEntry replaces the panic on a committed entry that does not
	// decode (a checksum mismatch, say); the replica applies nothing after
	// it either way.
	corruptEntry func(index uint64, err error)
	// peerHashHook and divergedHook stand in for the node-to-node requests
	// of the state check (statecheck.go) where there are none (in-memory
	// test clusters); skewApply may change a command before this replica
	// applies it (a deliberately diverged replica).
	peerHashHook func(ctx context.Context, id string, at uint64) (string, error)
	divergedHook func(id string, d divergedNotice)
	// logWriteHang, if > 0, replaces DefaultLogWriteHang (tests).
	logWriteHang time.Duration
	skewApply    func(c fsm.Command) fsm.Command
	// holdClock, when it returns true, keeps the leader from proposing
	// ticks and Expire entries (tests that need a lease left due).
	holdClock func(*replica) bool
	// diskFree replaces the statfs of the free-space guard (diskguard.go).
	diskFree func(dir string) (int64, error)
}
