package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// Offline work on a stopped server's data directory: reading the state it
// holds (every entry of its log applied over its newest snapshot) and the
// recovery from a permanent loss of quorum, which makes it the one voter
// of its cluster (raft.RecoverCluster).

// OfflineDir is a stopped server's data directory, open for offline work.
// It holds raft.db's lock (no server can start on it meanwhile) until
// Close.
type OfflineDir struct {
	dir    string
	kind   string // the log store
	bolt   *boltStore
	logs   raft.LogStore
	closer io.Closer
	snaps  *raft.FileSnapshotStore
	logger *slog.Logger
}

// openStopped opens raft.db of the data dir dir of a stopped server:
// refused, with hint after "stop it first", while a server runs on it.
func openStopped(dir, hint string) (*boltStore, uint64, error) {
	path := filepath.Join(dir, "raft.db")
	if _, err := os.Stat(path); err != nil {
		return nil, 0, fmt.Errorf("cluster: %s has no raft.db: not a data dir (%w)", dir, err)
	}
	bolt, format, err := openBolt(path)
	if isLocked(err) {
		return nil, 0, fmt.Errorf("cluster: %s is locked: a leasehold server runs on data dir %s; stop it first%s", path, dir, hint)
	}
	return bolt, format, err
}

// OpenOffline opens the data directory dir of a stopped server. It refuses
// a directory a server runs on (raft.db's lock), one of a newer data
// format, one whose log move was cut short, and one without Raft state.
// It writes nothing but what any server start writes first (the data
// format's record).
func OpenOffline(dir string, logger *slog.Logger) (*OfflineDir, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bolt, format, err := openStopped(dir, "")
	if err != nil {
		return nil, err
	}
	d := &OfflineDir{dir: dir, bolt: bolt, logger: logger}
	dl, err := detectLogStore(dir, bolt, format)
	if err == nil && dl.kind == "" {
		err = fmt.Errorf("cluster: data dir %s has no Raft state", dir)
	}
	if err != nil {
		bolt.Close()
		return nil, err
	}
	d.kind = dl.kind
	if d.snaps, err = raft.NewFileSnapshotStoreWithLogger(dir, 2, newHCLogger("snapshot", logger)); err != nil {
		bolt.Close()
		return nil, fmt.Errorf("cluster: snapshot store: %w", err)
	}
	if d.logs, d.closer, err = openLogs(dir, bolt, format, "", 0, logger); err != nil {
		bolt.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the stores and releases the directory's lock.
func (d *OfflineDir) Close() error {
	err := d.closer.Close()
	if berr := d.bolt.Close(); err == nil {
		err = berr
	}
	return err
}

// LogStore is the directory's Raft log store: LogStoreBoltDB or
// LogStoreWAL.
func (d *OfflineDir) LogStore() string { return d.kind }

// Replayed is the state of a data directory as Replay found it.
type Replayed struct {
	// SnapshotIndex is the index of the snapshot the state started from
	// (0: none).
	SnapshotIndex uint64
	// Index and Term are those of the last entry applied (or of the
	// snapshot, when the log holds nothing after it).
	Index, Term uint64
	// Configuration is the latest Raft configuration the directory holds
	// (the snapshot's, or a later one from its log), committed or not.
	Configuration Configuration
}

// Replay restores the newest snapshot that opens into fsm (the one a
// starting server and raft.RecoverCluster take) and applies every command
// of the log after it. The log's tail may not have been committed: a
// server that starts on the directory could see it replaced by its leader.
// fsm must be new; Replay changes nothing in the directory.
func (d *OfflineDir) Replay(fsm raft.FSM) (out Replayed, err error) {
	var conf raft.Configuration
	defer func() { out.Configuration = fromRaft(conf) }()
	metas, err := d.snaps.List()
	if err != nil {
		return out, fmt.Errorf("cluster: list the snapshots: %w", err)
	}
	for _, m := range metas {
		meta, rc, err := d.snaps.Open(m.ID)
		if err != nil {
			d.logger.Warn("skipping a snapshot that does not open", "id", m.ID, "err", err)
			continue
		}
		err = fsm.Restore(rc)
		if err != nil {
			d.logger.Warn("skipping a snapshot that does not restore", "id", m.ID, "err", err)
			continue
		}
		out.SnapshotIndex, out.Index, out.Term, conf = meta.Index, meta.Index, meta.Term, meta.Configuration
		break
	}
	if len(metas) > 0 && out.SnapshotIndex == 0 {
		return out, fmt.Errorf("cluster: none of the %d snapshots of %s restores", len(metas), d.dir)
	}
	last, err := d.logs.LastIndex()
	if err != nil {
		return out, fmt.Errorf("cluster: read the log's last index: %w", err)
	}
	for i := out.SnapshotIndex + 1; i <= last; i++ {
		var e raft.Log
		if err := d.logs.GetLog(i, &e); err != nil {
			return out, fmt.Errorf("cluster: read log entry %d of %d: %w", i, last, err)
		}
		switch e.Type {
		case raft.LogCommand:
			if err, ok := fsm.Apply(&e).(error); ok && err != nil {
				return out, fmt.Errorf("cluster: log entry %d: %w", i, err)
			}
		case raft.LogConfiguration:
			conf = raft.DecodeConfiguration(e.Data)
		}
		out.Index, out.Term = e.Index, e.Term
	}
	return out, nil
}

// ErrNotInConfiguration: Recover was asked to keep a server its
// configuration does not list.
var ErrNotInConfiguration = errors.New("cluster: the server is not in the data directory's configuration")

// Recover rewrites the directory's Raft state for a permanent loss of
// quorum: its configuration becomes self alone, a voter, so that a server
// started on it elects itself and serves; other servers join it as new
// ones. The state is every entry of the log applied over the newest
// snapshot (raft.RecoverCluster, given fsm, a new state machine, which
// must fail no entry: run Replay first). It writes a snapshot of that
// state, then empties the log. Before it changes anything it copies
// raft.db, and a raft-wal log, into dir/recover-backup-<UTC time>,
// whose path it returns.
func (d *OfflineDir) Recover(self Server, fsm raft.FSM) (string, error) {
	if self.ID == "" || self.Address == "" {
		return "", fmt.Errorf("cluster: recover: the server needs an id and an address")
	}
	self.Voter = true
	backup, err := backupRaftDB(d.dir, "recover", d.bolt)
	if err != nil {
		return "", err
	}
	if d.kind == LogStoreWAL {
		if err := copyDir(filepath.Join(d.dir, walDir), filepath.Join(backup, walDir)); err != nil {
			return backup, fmt.Errorf("cluster: back up wal/: %w", err)
		}
	}
	rc := Config{NodeID: self.ID, Logger: d.logger}.withDefaults().raftConfig(nil)
	_, trans := raft.NewInmemTransport(raft.ServerAddress(self.Address))
	defer trans.Close()
	conf := raft.Configuration{Servers: []raft.Server{self.raft()}}
	if err := raft.RecoverCluster(rc, fsm, d.logs, d.bolt, d.snaps, trans, conf); err != nil {
		return backup, fmt.Errorf("cluster: recover: %w", err)
	}
	return backup, nil
}

// copyDir copies the regular files of src into a new directory dst, and
// fsyncs them.
func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return syncDir(dst)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
