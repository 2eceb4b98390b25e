package node

import (
	"time"

	"github.com/leasehold/leasehold/internal/ctxtime"
	"github.com/leasehold/leasehold/wire"
)

// What the node's loops share: the pause between retries, a sleep that a
// context cuts short, the monotonic anchor of times kept as durations, and
// the answer of an operation the node's shutdown cut short.

// backoff is the pause before retry number try+1 of a leadership step.
func backoff(try int) time.Duration {
	return min(50*time.Millisecond<<min(try, 5), time.Second)
}

// sleepCtx sleeps for d, or until ctx ends (its error).
var sleepCtx = ctxtime.Sleep

// processStart anchors the monotonic times kept as durations (restoreAt):
// a wall-clock step must not make an old restore look recent.
var processStart = time.Now()

// errShuttingDown answers an operation the node's shutdown cut short.
func errShuttingDown() *wire.Error {
	return &wire.Error{Code: wire.CodeUnavailable, Message: "node is shutting down"}
}
