//go:build canary_nosync

package cluster

// canaryNoSync (build tag canary_nosync) is a deliberate bug for the chaos
// suite's power cuts to catch: raft.db commits without fsync, so an
// acknowledged write can be lost when the power goes (a process kill keeps
// it: the page cache survives). Never set in a normal build.
const canaryNoSync = true
