//go:build !chaos

package node

import "github.com/hashicorp/raft"

// storeWrapper is Config.WrapRaftStores' type.
type storeWrapper = func(raft.LogStore, raft.StableStore) (raft.LogStore, raft.StableStore)

// chaosStores is w: only a build with the `chaos` tag adds disk faults
// (disk_chaos.go).
func chaosStores(w storeWrapper) storeWrapper { return w }
