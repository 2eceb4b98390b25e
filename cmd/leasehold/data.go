package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/node"
)

const dataUsage = "usage: leasehold data migrate-log --data-dir DIR --to boltdb|wal\n" +
	"       leasehold data recover --data-dir DIR [--node-id ID] [--raft-addr ADDR]\n" +
	"       leasehold data export-snapshot --data-dir DIR FILE"

// dataCmd runs the offline data dir commands: migrate-log, recover,
// export-snapshot.
func (a *app) dataCmd(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(a.stdout, dataUsage)
		return nil
	}
	if len(args) > 0 {
		switch args[0] {
		case "migrate-log":
			return a.dataMigrateLog(args[1:])
		case "recover":
			return a.dataRecover(args[1:])
		case "export-snapshot":
			return a.dataExportSnapshot(args[1:])
		}
	}
	return usageErrorf("%s", dataUsage)
}

// dataMigrateLog is "data migrate-log".
func (a *app) dataMigrateLog(args []string) error {
	fs := a.newFlagSet("data migrate-log", "", "Move the Raft log of a STOPPED server's data dir to another log store: boltdb (raft.db)\n"+
		"or wal (wal/, raft-wal). It refuses while a server runs on the directory (raft.db's lock).\n"+
		"Before it changes anything it copies raft.db into DIR/log-backup-<UTC time>/; a move out\n"+
		"of wal/ then moves wal/ itself there. Run it again to finish a move cut short.\n"+
		"See docs/operations.md, \"The Raft log store\".")
	dir := fs.String("data-dir", "", "the data dir (--data-dir of the stopped server)")
	to := fs.String("to", "", "the log store to move to: boltdb or wal")
	if err := a.parseNone(fs, args, nil, ""); err != nil {
		return err
	}
	if *dir == "" || (*to != cluster.LogStoreBoltDB && *to != cluster.LogStoreWAL) {
		return usageErrorf("%s", dataUsage)
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := cluster.MigrateLog(*dir, *to, logger)
	if err != nil {
		if res.Backup != "" {
			return fmt.Errorf("%w (backup of raft.db before the move: %s)", err, res.Backup)
		}
		return err
	}
	if res.Backup == "" {
		_, err = fmt.Fprintf(a.stdout, "the raft log of %s is already in %s: nothing moved\n", *dir, *to)
		return err
	}
	what := "raft.db as it was"
	if res.From == cluster.LogStoreWAL {
		what += " and the wal/ directory"
	}
	entries := "no entries"
	if res.Last > 0 {
		entries = fmt.Sprintf("entries %d-%d", res.First, res.Last)
	}
	_, err = fmt.Fprintf(a.stdout, "moved the raft log of %s from %s to %s (%s)\nbackup: %s (%s); delete it once the server runs well on the moved log\n",
		*dir, res.From, res.To, entries, res.Backup, what)
	return err
}

// dataRecover is "data recover": the survivor of a permanent loss of
// quorum made the one voter of its cluster.
func (a *app) dataRecover(args []string) error {
	fs := a.newFlagSet("data recover", "", "Recover a cluster that lost its quorum for good from the data dir of one STOPPED survivor:\n"+
		"its Raft configuration becomes this server alone, so that started again (same --node-id, same\n"+
		"--data-dir) it elects itself and serves every lease it had applied, fencing tokens going on from\n"+
		"the highest it saw. Then start fresh servers (empty data dirs) that --join it. Never start the\n"+
		"lost servers again on their old data dirs: wipe them first. It refuses while a server runs on\n"+
		"the directory. Before it changes anything it copies raft.db (and wal/) into\n"+
		"DIR/recover-backup-<UTC time>/. See docs/operations.md, \"Lost quorum\".")
	dir := fs.String("data-dir", "", "the data dir (--data-dir of the stopped survivor)")
	id := fs.String("node-id", "", "the survivor's --node-id (default: the server of the configuration recorded with this data dir)")
	addr := fs.String("raft-addr", "", "the survivor's Raft address as the others will dial it (default: the one in its configuration)")
	pos, err := a.parse(fs, args, nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *dir == "" {
		return usageErrorf("%s", dataUsage)
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	info, err := node.RecoverDataDir(*dir, *id, *addr, logger)
	if err != nil {
		if info != nil && info.Backup != "" {
			return fmt.Errorf("%w (backup of the Raft state before the recovery: %s)", err, info.Backup)
		}
		return err
	}
	dropped := "none"
	if len(info.Dropped) > 0 {
		dropped = strings.Join(info.Dropped, " ")
	}
	fmt.Fprintf(a.stdout, "recovered %s: its configuration is now %s (%s) alone; left out: %s\n", *dir, info.NodeID, info.RaftAddr, dropped)
	fmt.Fprintf(a.stdout, "state kept: index %d, term %d, %d active leases, %d active sessions, fencing token %d\n",
		info.Index, info.Term, info.State.ActiveLeases, info.State.ActiveSessions, info.State.FencingToken)
	_, err = fmt.Fprintf(a.stdout, "backup: %s; start the server on %s with --node-id %s, then add fresh servers\n", info.Backup, *dir, info.NodeID)
	return err
}

// dataExportSnapshot is "data export-snapshot": a snapshot file of a
// stopped server's state, for "snapshot restore".
func (a *app) dataExportSnapshot(args []string) error {
	fs := a.newFlagSet("data export-snapshot", "FILE", "Write a snapshot file (the format of 'leasehold snapshot save', for 'snapshot inspect'\n"+
		"and 'snapshot restore') of the state of a STOPPED server's data dir: its log applied over its\n"+
		"newest snapshot (a tail of the log that was never committed included). It refuses while a\n"+
		"server runs on the directory. FILE is written through FILE.tmp, synced, then renamed.")
	dir := fs.String("data-dir", "", "the data dir (--data-dir of the stopped server)")
	pos, err := a.parse(fs, args, nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *dir == "" {
		return usageErrorf("%s", dataUsage)
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	info, err := exportSnapshotFile(*dir, pos[0], logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "wrote %s from data dir %s\n", pos[0], *dir)
	return printSnapshotInfo(a.stdout, info)
}

// exportSnapshotFile writes the snapshot of data dir dir into file
// (writeSnapshotFile: through file.tmp, synced, then renamed).
func exportSnapshotFile(dir, file string, logger *slog.Logger) (*node.SnapshotInfo, error) {
	return writeSnapshotFile(file, func(w io.Writer) (*node.SnapshotInfo, error) { return node.ExportDataDir(dir, w, logger) }, false)
}
