package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/leasehold/leasehold/cluster"
)

const dataUsage = "usage: leasehold data migrate-log --data-dir DIR --to boltdb|wal"

// dataCmd runs the offline data dir commands: migrate-log.
func (a *app) dataCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "migrate-log" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(a.stdout, dataUsage)
			return nil
		}
		return usageErrorf("%s", dataUsage)
	}
	fs := a.newFlagSet("data migrate-log", "", "Move the Raft log of a STOPPED server's data dir to another log store: boltdb (raft.db)\n"+
		"or wal (wal/, raft-wal). It refuses while a server runs on the directory (raft.db's lock).\n"+
		"Before it changes anything it copies raft.db into DIR/log-backup-<UTC time>/; a move out\n"+
		"of wal/ then moves wal/ itself there. Run it again to finish a move cut short.\n"+
		"See docs/operations.md, \"The Raft log store\".")
	dir := fs.String("data-dir", "", "the data dir (--data-dir of the stopped server)")
	to := fs.String("to", "", "the log store to move to: boltdb or wal")
	pos, err := a.parse(fs, args[1:], nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("data migrate-log takes no arguments")
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
