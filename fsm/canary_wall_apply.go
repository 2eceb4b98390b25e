//go:build !canary_wall_apply

package fsm

// canaryWallApply (build tag canary_wall_apply) is a deliberate bug for the
// chaos suite to catch: a grant records the applying server's own wall clock
// as the lease's acquired_at instead of the time in the command, so replicas
// that applied the same log hold different states. Never set in a normal
// build.
const canaryWallApply = false

// canaryWallMS is never called in a normal build.
func canaryWallMS() int64 { return 0 }
