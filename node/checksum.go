package node

import (
	"github.com/leasehold/leasehold/fsm"
)

// Entry checksums (fsm.VersionChecked): the leader writes them once every
// server of the configuration reads them (and for good once that is
// recorded in the state: features.go); a server stops at a committed
// entry whose checksum does not match (replica.go).

// encode encodes a command for the log: with a checksum once every server
// of the configuration reads one (updateEntryCRC), else as before.
func (gc *groupCommit) encode(c fsm.Command) ([]byte, error) {
	if gc.crcOK.Load() || gc.recorded(fsm.FeatureEntryCRC) {
		return fsm.EncodeChecked(c)
	}
	return fsm.Encode(c)
}

// updateEntryCRCNow is updateEntryCRC with the current configuration, so
// that a new term writes checksums from its first entry.
func (gc *groupCommit) updateEntryCRCNow() {
	if ids, err := gc.cl.ServerIDs(); err == nil {
		gc.updateEntryCRC(ids)
	}
}

// updateEntryCRC records whether every server of the configuration (ids)
// reads checksums: recorded in the state, or every server but this one
// announces EntryCRC in gossip (features.go).
func (gc *groupCommit) updateEntryCRC(ids []string) {
	gc.crcOK.Store(gc.featureOK(fsm.FeatureEntryCRC, ids))
}
