package chaos

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// saveSnapshot saves a snapshot file of the cluster through the leader's
// API, as an operator would (GET /v1/cluster/snapshot).
func (e *Env) saveSnapshot(ctx context.Context) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		l, err := e.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := e.admin[l].SaveSnapshot(sctx, &buf)
		cancel()
		if err == nil {
			e.Note("snapshot-save", fmt.Sprintf("node %d saved index %d (%d bytes)", l, info.Index, info.Size), nil)
			e.Count("snapshots-saved", 1)
			return buf.Bytes(), nil
		}
		if attempt >= 4 || ctx.Err() != nil {
			return nil, fmt.Errorf("save a snapshot: %w", err)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// fileLeases decodes a snapshot file and names, per key, the lease it has
// active (the workload's keys have limit 1).
func fileLeases(file []byte) (map[string]string, error) {
	_, body, err := wire.ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		return nil, err
	}
	f := fsm.New()
	if err := f.Restore(body); err != nil {
		return nil, err
	}
	ls, _ := f.Leases(fsm.LeaseFilter{State: fsm.StateActive})
	out := make(map[string]string, len(ls))
	for _, l := range ls {
		if l.Limit != 1 {
			return nil, fmt.Errorf("lease %s on %s has limit %d: the model knows limit 1 only", l.ID, l.Key, l.Limit)
		}
		out[l.Key] = l.ID
	}
	return out, nil
}

// restoreSnapshot restores file through the leader's API (PUT
// /v1/cluster/snapshot) and records the restore in the history as a
// KRestore operation, for the checkers. A restore is not idempotent: it is
// tried again only after a definite failure (no leader, writes that did not
// pause: nothing changed), at most a few times.
func (e *Env) restoreSnapshot(ctx context.Context, file []byte) error {
	restored, err := fileLeases(file)
	if err != nil {
		return fmt.Errorf("read the snapshot file: %w", err)
	}
	for attempt := 1; ; attempt++ {
		l, err := e.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			return err
		}
		op := Op{Process: e.H.NewProcess(), Worker: -1, Node: l, Kind: KRestore, Restored: restored}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		op.Call = e.H.Now()
		info, err := e.admin[l].RestoreSnapshot(rctx, bytes.NewReader(file))
		op.Return = e.H.Now()
		cancel()
		op.Status, op.Code, op.Err = classify(err)
		e.H.Add(op)
		switch {
		case err == nil:
			e.Note("snapshot-restore", fmt.Sprintf("node %d restored index %d at %d: %d leases kept, %d re-fenced, %d superseded",
				l, info.Index, info.RestoredIndex, info.Kept, info.Refenced, info.Superseded), nil)
			e.Count("restores", 1)
			e.Count("restore-file-leases", len(restored))
			e.Count("restore-kept", info.Kept)
			e.Count("restore-refenced", info.Refenced)
			e.Count("restore-superseded", info.Superseded)
			return nil
		case op.Status == StatusFail && (op.Code == string(wire.CodeNoLeader) || op.Code == string(wire.CodeUnavailable)) && attempt < 5:
			e.Note("snapshot-restore", fmt.Sprintf("node %d, attempt %d: nothing changed; trying again", l, attempt), err)
			if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		default:
			e.Note("snapshot-restore", fmt.Sprintf("node %d, attempt %d", l, attempt), err)
			return fmt.Errorf("restore: %w", err)
		}
	}
}
