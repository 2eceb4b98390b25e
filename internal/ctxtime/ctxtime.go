// Package ctxtime waits as long as a context lets it.
package ctxtime

import (
	"context"
	"time"
)

// Sleep sleeps for d, or until ctx ends (then its error); d <= 0 does not
// sleep.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
