package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/node"
)

// FactoryOptions configure a tier's clusters.
type FactoryOptions struct {
	// Binary is the leasehold executable the netns tier runs.
	Binary string
}

// NewFactory returns the cluster factory of a tier: "netns" (real
// processes in network namespaces) or "inproc" (nodes in this process).
func NewFactory(tier string, o FactoryOptions) (ClusterFactory, error) {
	switch tier {
	case "inproc":
		return func(ctx context.Context, nodes int, dir string, s *Scenario) (Cluster, error) {
			return NewInprocCluster(ctx, InprocOptions{Nodes: nodes, Dir: dir, Configure: func(_ int, cfg *node.Config) {
				if s != nil && s.SnapshotThreshold > 0 {
					cfg.SnapshotThreshold = uint64(s.SnapshotThreshold)
					cfg.SnapshotInterval = 200 * time.Millisecond
					cfg.TrailingLogs = uint64(s.SnapshotThreshold) / 2
				}
				if s != nil && s.RaftLog != "" {
					cfg.RaftLog = s.RaftLog
				}
			}})
		}, nil
	case "netns":
		return func(ctx context.Context, nodes int, dir string, s *Scenario) (Cluster, error) {
			var flags []string
			if s != nil && s.SnapshotThreshold > 0 {
				flags = append(flags, "--snapshot-threshold", fmt.Sprint(s.SnapshotThreshold),
					"--snapshot-interval", "200ms", "--trailing-logs", fmt.Sprint(max(1, s.SnapshotThreshold/2)))
			}
			var disk int64
			if s != nil && s.DiskMiB > 0 {
				disk = int64(s.DiskMiB) << 20
				flags = append(flags, "--min-free-disk", fmt.Sprintf("%dMiB", s.MinFreeDiskMiB))
			}
			if s != nil && s.RaftLog != "" {
				flags = append(flags, "--raft-log", s.RaftLog)
			}
			return NewNetnsCluster(ctx, NetnsOptions{Nodes: nodes, Binary: o.Binary, Dir: dir, ExtraFlags: flags, DiskSize: disk,
				LazyDisk: s != nil && (s.PowerCut || s.LazyDisk)})
		}, nil
	}
	return nil, fmt.Errorf("chaos: unknown tier %q (want netns or inproc)", tier)
}
