//go:build canary_no_guard

package fsm

// canaryNoGuard (build tag canary_no_guard) is a deliberate bug for the
// chaos suite to catch: the corruption guard is off, so a server applies a
// log entry whose checksum does not match and ignores a state check that
// finds its state differs from the cluster's. Never set in a normal build.
const canaryNoGuard = true
