//go:build chaos

package node

import (
	"os"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/internal/diskfault"
)

// storeWrapper is Config.WrapRaftStores' type.
type storeWrapper = func(raft.LogStore, raft.StableStore) (raft.LogStore, raft.StableStore)

// chaosDisk is the disk fault of a chaos build's process, set from the
// chaos fault file (clock_chaos.go): "disk_stall": true holds every write
// to Raft's log and stable store until it is false again;
// "disk_delay_ns" adds that much to each write.
var chaosDisk diskfault.Fault

// chaosStores wraps Raft's stores with chaosDisk (then w) when the chaos
// fault file is in use.
func chaosStores(w storeWrapper) storeWrapper {
	if os.Getenv(chaosClockEnv) == "" {
		return w
	}
	return func(logs raft.LogStore, stable raft.StableStore) (raft.LogStore, raft.StableStore) {
		logs, stable = chaosDisk.Wrap(logs, stable)
		if w != nil {
			return w(logs, stable)
		}
		return logs, stable
	}
}

// setChaosDisk applies the file's disk fault.
func setChaosDisk(f chaosFault) {
	chaosDisk.Set(f.DiskStall, time.Duration(max(f.DiskDelayNS, 0)))
}
