//go:build !canary_clock_stops

package node

// canaryClockStops (build tag canary_clock_stops) is a deliberate bug for
// the chaos suite to catch: a leader elected once the cluster clock runs
// never ticks (only a new cluster's first leader starts the clock), so
// after the first leader change time stands still. Never set in a normal
// build.
const canaryClockStops = false
