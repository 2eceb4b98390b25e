package main

import (
	"os"
	"runtime/debug"
)

// relaxGC trades memory for CPU in the long-running commands (server,
// bench): unless GOGC is set in the environment, the heap may grow to five
// times the live data before a collection (GOGC=400) — on two cores the
// collector was one of the largest CPU users under load. Unless GOMEMLIMIT is
// set, a soft limit of 512 MiB then makes the collector run more often as
// the heap approaches it, so a large state (a million leases is about
// 480 MiB live) does not pay five times its size in memory. The limit is
// soft: a larger live heap still works, with more collector CPU.
func relaxGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(512 << 20)
	}
}
