//go:build !chaos

package node

import (
	"log/slog"
	"time"
)

// The node's clock. What decides expiry reads the monotonic clock (the tick
// loop's period and timers); what is only displayed reads the wall clock
// (WallMS in commands, expires_at in answers). In a normal build both are
// the real clock: these functions inline to the time package's. A build
// with the `chaos` tag replaces them (clock_chaos.go) with a clock the
// chaos suite shifts and speeds up from outside.

// wallNow is the wall-clock time, for display only.
func wallNow() time.Time { return time.Now() }

// monoNow is a monotonic reading, for elapsed times: compare two with Sub,
// never one with a wallNow.
func monoNow() time.Time { return time.Now() }

// clockTimer is a timer on the monotonic clock.
type clockTimer = time.Timer

func newClockTimer(d time.Duration) *clockTimer { return time.NewTimer(d) }

// startClock installs the chaos clock when the build has one; the result
// undoes it.
func startClock(*slog.Logger) (stop func()) { return func() {} }
