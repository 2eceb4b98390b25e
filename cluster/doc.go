// Package cluster is one Leasehold server's consensus: the hashicorp/raft
// instance behind Cluster (its *raft.Raft stays inside the package), the
// log in raft.db (raft-boltdb/v2) or raft-wal with the data format (fsync
// on; format.go), a file snapshot store, the TCP or mutual-TLS transport
// with the cluster identity exchange, gossip (memberlist), and the
// orchestration around Raft:
//
//   - consensus.go: state, indexes, the configuration and its changes,
//     Apply with ClassifyApply (what a failed proposal means for the write),
//     and ReadIndex, the read barrier of a leader established in a term;
//   - leadership.go: the watchdog that hands on a leader that commits
//     nothing, StepDown (a transfer, or TimeoutNow when Raft's leader loop
//     is stuck), and HandOff before a graceful stop;
//   - members*.go (with localid.go, bootstrap.go and gossip.go): the
//     server's membership, one owner: gossip, joining and re-joining,
//     bootstrap-expect, admission, the refusal state and the cluster
//     identity, over the registry and replicated id the server lends it;
//   - reconcile.go: the leader's reconciliation of gossip with the
//     configuration and autopilot, over the member registry the server
//     lends it (Registry).
//
// Configuration (Config, GossipConfig, Membership): a numeric field left
// zero means its default; a negative value turns a setting off where the
// field says so (Membership.DeadServerTimeout, StabilizationTime), and is
// invalid elsewhere. Packages node and api follow the same rule.
//
// The package knows Raft, storage and membership, not leases: it takes any
// raft.FSM. Callers learn about leadership through OnLeadership, whose
// context is cancelled the moment this server stops being leader.
package cluster
