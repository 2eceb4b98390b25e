//go:build canary_stale_read

package node

// canaryStaleRead (build tag canary_stale_read) is a deliberate bug for the
// chaos suite to catch: linearizable reads are answered from local state,
// without confirming leadership or waiting for the commit index. Never set
// in a normal build.
const canaryStaleRead = true
