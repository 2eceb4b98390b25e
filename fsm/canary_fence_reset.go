//go:build !canary_fence_reset

package fsm

// canaryFenceReset (build tag canary_fence_reset) is a deliberate bug for the
// chaos suite to catch: a release rolls the fencing counter back to below the
// released lease's token, and the counter no longer follows the log index,
// so later grants reuse or lower tokens. Never
// set in a normal build.
const canaryFenceReset = false
