//go:build !canary_fence_reset

package fsm

// canaryFenceReset (build tag canary_fence_reset) is a deliberate bug for the
// chaos suite to catch: a release rolls the fencing counter back to below the
// released lease's token, so a later grant can reuse or lower a token. Never
// set in a normal build.
const canaryFenceReset = false
