//go:build canary_tick_at_once

package node

// canaryTickAtOnce (build tag canary_tick_at_once) is a deliberate bug for
// the chaos suite to catch: every new leader ticks at once instead of one
// period after its election, so leadership changes compress time. Never set
// in a normal build.
const canaryTickAtOnce = true
