package main

import (
	"os"
	"runtime/debug"
)

// relaxGC trades memory for CPU in the long-running commands (server,
// bench): the heap may grow to five times the live data before a collection
// (GOGC=400) unless GOGC is set in the environment. A lease server's live
// heap is small next to the machine, and on two cores the collector was
// one of the largest CPU users under load.
func relaxGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
