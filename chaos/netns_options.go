package chaos

import (
	"log/slog"
	"time"
)

// NetnsOptions configure NewNetnsCluster (Linux; elsewhere it returns
// ErrUnsupported).
type NetnsOptions struct {
	// Nodes is the number of servers, 1 to 9. Default 5.
	Nodes int
	// Binary is the path of the leasehold binary to run. Required.
	Binary string
	// Dir is the run's output directory: node logs in Dir/logs/nI.log
	// (appended across restarts), data in Dir/data/nI, clock files in
	// Dir/clock/nI.json. Required.
	Dir string
	// RunID names everything the run creates (lhc<RunID>...): 1 to 8
	// characters of [a-z0-9]. Default: random.
	RunID string
	// ExtraFlags are passed to every server after the flags the cluster
	// sets (for example a small snapshot threshold or --tick-period).
	ExtraFlags []string
	// Env is added to every server's environment (KEY=VALUE).
	Env []string
	// Logger receives the harness's account of what it does (every fault,
	// kill, restart). Default: Dir/logs/harness.log, appended.
	Logger *slog.Logger
	// DiskSize, if > 0, puts each node's data directory on a tmpfs of
	// this many bytes of its own, mounted before the node first starts and
	// unmounted by Close (its data goes with it, keepData or not), so that
	// FillDisk can fill it. 0: the data directories are on Dir's
	// filesystem and FillDisk is ErrUnsupported.
	DiskSize int64
	// LazyDisk puts each node's data directory on a lazy filesystem
	// (chaos/lazyfs) over Dir/data/nI, so that PowerCut can drop what a
	// server wrote and did not fsync. Not with DiskSize.
	LazyDisk bool
	// StartTimeout bounds NewNetnsCluster's wait for every node to be ready
	// with all voters, on top of ctx. Default 90s.
	StartTimeout time.Duration
}
