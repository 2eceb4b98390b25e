//go:build canary_no_snapshot_gate

package cluster

// canaryNoSnapshotGate (build tag canary_no_snapshot_gate) takes the
// snapshot gate out (candsnap.go): every RPC reaches Raft as it came, so
// that TestCandidateSnapshotThenLeaderLost is seen failing without it.
// Never set in a normal build.
const canaryNoSnapshotGate = true
