//go:build canary_early_expiry

package fsm

// canaryEarlyExpiry (build tag canary_early_expiry) is a deliberate bug for
// the chaos suite to catch: a standalone lease expires one tick before its
// deadline. Never set in a normal build.
const canaryEarlyExpiry = true
