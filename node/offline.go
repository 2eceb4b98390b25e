package node

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// Offline work on a stopped server's data directory (leasehold data
// recover, leasehold data export-snapshot). The state of a directory is
// every entry of its log applied over its newest snapshot: the state the
// server would have applied had it gone on alone. Its log's tail may hold
// entries that were never committed; a recovery keeps them (they were
// accepted by a leader, and fencing tokens only grow through them).

// offlineFSM is the state machine without a server around it: entries are
// decoded and applied, events and notices dropped. An entry that does not
// decode stops the replay (Replay returns the error).
type offlineFSM struct{ f *fsm.FSM }

func (o *offlineFSM) Apply(l *raft.Log) any {
	cmd, err := fsm.Decode(l.Data)
	if err != nil {
		return fmt.Errorf("the entry does not decode: %w", err)
	}
	o.f.Apply(l.Index, cmd)
	o.f.DrainEvents(func(*fsm.Event) {})
	o.f.TakeNotices()
	return nil
}

func (o *offlineFSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{s: o.f.Snapshot()}, nil
}

func (o *offlineFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	f := fsm.New()
	if err := f.Restore(rc); err != nil {
		return err
	}
	o.f = f
	return nil
}

// RecoverInfo is what RecoverDataDir did.
type RecoverInfo struct {
	// NodeID and RaftAddr are the one voter of the new configuration.
	NodeID, RaftAddr string
	// Dropped are the servers of the old configuration left out.
	Dropped []string
	// Index and Term are those of the state kept (the last entry of the
	// log applied).
	Index, Term uint64
	// Backup holds raft.db (and a raft-wal log) as they were.
	Backup string
	// State summarises the state kept.
	State *SnapshotState
}

// RecoverDataDir recovers a cluster that lost its quorum for good from the
// data directory dir of one stopped survivor: its Raft configuration
// becomes this server alone, a voter, so that started again on dir (with
// the same node id) it elects itself and serves every lease it had
// applied; fencing tokens go on from the highest it saw. Fresh servers
// then join it as new ones. nodeID is the survivor's id: when empty, the
// server of the configuration whose recorded data directory is dir's
// (the member registry). raftAddr, when set, replaces its Raft address.
// Nothing changes when the state does not replay (a log entry that does
// not decode) or the directory is locked by a running server.
func RecoverDataDir(dir, nodeID, raftAddr string, logger *slog.Logger) (*RecoverInfo, error) {
	od, err := cluster.OpenOffline(dir, logger)
	if err != nil {
		return nil, err
	}
	defer od.Close()
	o := &offlineFSM{f: fsm.New()}
	rep, err := od.Replay(o)
	if err != nil {
		return nil, err
	}
	self, err := survivor(dir, nodeID, rep.Configuration, o.f)
	if err != nil {
		return nil, err
	}
	if raftAddr != "" {
		self.Address = raftAddr
	}
	info := &RecoverInfo{NodeID: self.ID, RaftAddr: self.Address, Index: rep.Index, Term: rep.Term,
		State: stateSummary(o.f)}
	for _, s := range rep.Configuration.Servers {
		if s.ID != self.ID {
			info.Dropped = append(info.Dropped, s.ID)
		}
	}
	info.Backup, err = od.Recover(self, &offlineFSM{f: fsm.New()})
	if err != nil {
		return info, err
	}
	return info, nil
}

// survivor is the server of conf that dir belongs to: nodeID's, or the one
// whose recorded data directory (incarnation) is dir's.
func survivor(dir, nodeID string, conf cluster.Configuration, f *fsm.FSM) (cluster.Server, error) {
	if nodeID != "" {
		for _, s := range conf.Servers {
			if s.ID == nodeID {
				return s, nil
			}
		}
		return cluster.Server{}, fmt.Errorf("%w: %s is not among %s", cluster.ErrNotInConfiguration, nodeID, serverIDs(conf))
	}
	b, err := os.ReadFile(filepath.Join(dir, "incarnation"))
	if err != nil {
		return cluster.Server{}, fmt.Errorf("which server's data directory is this (read its incarnation: %v)? give its node id", err)
	}
	inc := strings.TrimSpace(string(b))
	var found []cluster.Server
	for _, s := range conf.Servers {
		if rec, ok := f.Member(s.ID); ok && !rec.Removed && rec.Incarnation == inc {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		return cluster.Server{}, fmt.Errorf("%w: no one server of %s is recorded with this data directory (incarnation %s); give its node id",
			cluster.ErrNotInConfiguration, serverIDs(conf), inc)
	}
	return found[0], nil
}

func serverIDs(conf cluster.Configuration) string {
	ids := make([]string, 0, len(conf.Servers))
	for _, s := range conf.Servers {
		ids = append(ids, s.ID)
	}
	return "[" + strings.Join(ids, " ") + "]"
}

// ExportDataDir writes a snapshot file (the format of SaveSnapshot, which
// RestoreSnapshot and InspectSnapshotFile read) of the state of the stopped
// server's data directory dir to w, and describes it. It refuses a
// directory a server runs on. Nothing is written to w before the state has
// replayed.
func ExportDataDir(dir string, w io.Writer, logger *slog.Logger) (*SnapshotInfo, error) {
	od, err := cluster.OpenOffline(dir, logger)
	if err != nil {
		return nil, err
	}
	defer od.Close()
	o := &offlineFSM{f: fsm.New()}
	rep, err := od.Replay(o)
	if err != nil {
		return nil, err
	}
	if rep.Index == 0 {
		return nil, errors.New("the data directory holds no state to export")
	}
	nodeID := ""
	if s, err := survivor(dir, "", rep.Configuration, o.f); err == nil {
		nodeID = string(s.ID)
	}
	snap := o.f.Snapshot()
	h := sha256.New()
	size, err := snap.WriteTo(h)
	if err != nil {
		return nil, err
	}
	info := &SnapshotInfo{Format: SnapshotFileFormat, Index: rep.Index, Term: rep.Term, CreatedAt: wallNow().UTC(),
		NodeID: nodeID, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}
	hdr, err := encodeSnapshotHeader(info)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	if _, err := snap.WriteTo(w); err != nil {
		return nil, err
	}
	info.State = stateSummary(o.f)
	return info, nil
}
