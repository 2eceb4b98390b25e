//go:build !linux

package chaos

import (
	"context"
	"fmt"
	"log/slog"
)

// NetnsCluster is the real-process tier; it needs Linux.
type NetnsCluster struct{ Cluster }

// NewNetnsCluster needs Linux network namespaces and nftables.
func NewNetnsCluster(ctx context.Context, o NetnsOptions) (*NetnsCluster, error) {
	return nil, fmt.Errorf("chaos: the netns cluster needs Linux: %w", ErrUnsupported)
}

// Cleanup has nothing to remove outside Linux.
func Cleanup(ctx context.Context, log *slog.Logger) error { return nil }
