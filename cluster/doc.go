// Package cluster runs Raft for one Leasehold server: the hashicorp/raft
// instance, its raft-wal log and raft-boltdb stable store (fsync on), a file snapshot
// store, the TCP transport, bootstrap of a new single-node cluster, and
// leadership tracking.
//
// The package knows Raft, storage and membership, not leases: it takes any
// raft.FSM. Callers learn about leadership through OnLeadership, whose
// context is cancelled the moment this server stops being leader.
package cluster
