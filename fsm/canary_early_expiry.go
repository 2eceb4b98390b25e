//go:build !canary_early_expiry

package fsm

// canaryEarlyExpiry (build tag canary_early_expiry) is a deliberate bug for
// the chaos suite to catch: a standalone lease expires one tick before its
// TTL (its nominal end minus one tick, without the grace ticks). Expiring at
// t+n+1 instead of t+n+2 is too close to the bound for a black-box run to
// catch reliably. Never set in a normal build.
const canaryEarlyExpiry = false
