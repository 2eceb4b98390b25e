//go:build canary_writes_stuck

package node

// canaryWritesStuck (build tag canary_writes_stuck) is a deliberate bug for
// the chaos suite to catch: a leader elected once the cluster clock runs
// refuses every acquire as unavailable, so after the first leader change
// the cluster grants nothing. Never set in a normal build.
const canaryWritesStuck = true
