//go:build canary_wall_apply

package fsm

import "time"

// canaryWallApply (build tag canary_wall_apply) is a deliberate bug for the
// chaos suite to catch: a grant records the applying server's own wall clock
// as the lease's acquired_at instead of the time in the command, so replicas
// that applied the same log hold different states. Never set in a normal
// build.
const canaryWallApply = true

// canaryWallMS is this server's wall clock: what a replica must never read.
func canaryWallMS() int64 { return time.Now().UnixMilli() }
