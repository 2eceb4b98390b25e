// Package option fills in the options of a server's parts.
package option

import "time"

// OrNone is v, or def when v is 0, or 0 (none, off) when v is negative.
func OrNone[T int | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}
