package node

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// Online backup and restore of the whole cluster state.
//
// A snapshot file is self-describing (package wire reads and writes its
// framing): a magic line, the file format, a JSON header line with the
// body's size and SHA-256, then the body, the state machine's snapshot
// (fsm.Snapshot.WriteTo), and nothing after it. A truncated or corrupted
// file is refused before anything changes. The operations
// (SaveSnapshot, RestoreSnapshot) are in admin.go; backups below is what
// they run on.

// SnapshotFileFormat is the version of the snapshot file layout that
// SaveSnapshot writes and RestoreSnapshot reads (see package wire).
const SnapshotFileFormat = wire.SnapshotFileFormat

// SnapshotInfo describes a snapshot file; SnapshotState summarises the
// state in it.
type (
	SnapshotInfo  = wire.SnapshotInfo
	SnapshotState = wire.SnapshotState
)

func badSnapshot(format string, args ...any) *wire.Error {
	return &wire.Error{Code: wire.CodeInvalidArgument, Message: "invalid snapshot file: " + fmt.Sprintf(format, args...)}
}

// backups takes snapshots and runs restores for one server.
type backups struct {
	cfg     *Config
	log     *slog.Logger
	rep     *replica
	cl      *cluster.Cluster // set once Raft runs
	closing <-chan struct{}
	disk    *diskGuard
	mem     *cluster.Members
	gc      *groupCommit // encodes restore entries
	tk      *ticker      // the cluster's tick period
	// noLeader is the NO_LEADER answer naming the leader; featureOK
	// reports whether every server of ids runs a feature.
	noLeader  func() error
	featureOK func(fsm.Features, []string) bool
	// restoreMu runs one restore at a time; restoreAt is when one last
	// made progress (since processStart); onRestoreStep is a test's hook.
	restoreMu     sync.Mutex
	restoreAt     atomic.Int64
	onRestoreStep func(step string)
	// previewing is set while the leader's dry run of a restore holds
	// the state's read lock (applies, and so the term's commits, wait).
	previewing atomic.Bool
}

// awaitFirstTick waits until the state has recorded the cluster's tick
// period (its first tick does), which a snapshot must carry for
// RestoreSnapshot to refuse it in a cluster that ticks at another pace.
func (bk *backups) awaitFirstTick(ctx context.Context) error {
	timer := time.NewTimer(bk.cfg.ApplyTimeout)
	defer timer.Stop()
	for {
		ch, _ := bk.rep.waitApplied()
		bk.rep.mu.RLock()
		p := bk.rep.f.PeriodMS()
		bk.rep.mu.RUnlock()
		if p != 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-bk.closing:
			return errShuttingDown()
		case <-timer.C:
			return &wire.Error{Code: wire.CodeUnavailable, Message: "the cluster has not ticked yet; try again"}
		}
	}
}

// raftSnapshot has Raft take a snapshot of the state as of now. A barrier
// comes first: it makes the state reflect every committed write, and it is
// a new entry, so Raft never answers that there is nothing new to snapshot
// (unless an automatic snapshot got in between: then it tries again).
func (bk *backups) raftSnapshot(ctx context.Context) (raft.SnapshotFuture, error) {
	for attempt := 0; ; attempt++ {
		if err := bk.cl.Barrier(bk.cfg.ApplyTimeout); err != nil {
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				return nil, bk.noLeader()
			}
			return nil, &wire.Error{Code: wire.CodeUnavailable, Message: "snapshot: barrier: " + err.Error()}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fut := bk.cl.Snapshot()
		err := fut.Error()
		switch {
		case err == nil:
			return fut, nil
		case errors.Is(err, raft.ErrNothingNewToSnapshot) && attempt < 3:
			continue
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, errShuttingDown()
		}
		return nil, &wire.Error{Code: wire.CodeUnavailable, Message: "snapshot: " + err.Error()}
	}
}

// restoreSupported refuses a restore while a server of the configuration
// runs a version that does not know restore entries (it would stop on
// them): gossip says which do.
func (bk *backups) restoreSupported() error {
	ids, err := bk.cl.ServerIDs()
	if err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "restore: read the configuration: " + err.Error()}
	}
	if !bk.featureOK(fsm.FeatureRestoreLog, ids) || !bk.featureOK(fsm.FeatureRestoreBounds, ids) {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "a server of the configuration runs a version that cannot apply a restore " +
			"(or is not known to gossip yet); upgrade every server first, or retry shortly; nothing changed"}
	}
	return nil
}

// checkRestoreBody decodes the spooled body to check that it is a state
// this cluster can take, describes it in info, checks that the restore's
// result would hold to quota (a dry run of the rebase against the current
// state, with fence floor floor), and rewinds the spool.
func (bk *backups) checkRestoreBody(tmp *os.File, info *SnapshotInfo, quota fsm.Quota, floor uint64) error {
	rewind := func() error {
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return &wire.Error{Code: wire.CodeInternal, Message: "rewind the restore spool: " + err.Error()}
		}
		return nil
	}
	if err := rewind(); err != nil {
		return err
	}
	f, err := decodeSnapshotState(bufio.NewReaderSize(tmp, 1<<20))
	if err != nil {
		return err
	}
	info.State = stateSummary(f)
	if p, cur := f.PeriodMS(), bk.tk.period().Milliseconds(); p != 0 && p != cur {
		// Ticks count every TTL; the leader would keep ticking at its own
		// period, so time would run at the wrong speed.
		return badSnapshot("its tick period is %dms; this cluster ticks every %dms", p, cur)
	}
	// The dry run holds applies and counts as the restore's progress.
	// Above restorePreviewMax records it is skipped: the commit's apply
	// checks the limits then, on every server alike.
	bk.rep.mu.RLock()
	cur := bk.rep.f.Records()
	bk.rep.mu.RUnlock()
	if fr := f.Records(); cur.Leases+cur.Sessions+fr.Leases+fr.Sessions > restorePreviewMax {
		bk.log.Info("restore dry run skipped: the commit checks the count limits", "file_leases", fr.Leases, "cluster_leases", cur.Leases)
		return rewind()
	}
	bk.previewing.Store(true)
	start := time.Now()
	bk.rep.mu.RLock()
	st, qerr := f.PreviewRestore(bk.rep.f, quota, floor)
	bk.rep.mu.RUnlock()
	bk.markRestoreProgress()
	bk.previewing.Store(false)
	bk.log.Info("restore dry run", "refenced", st.Refenced, "kept", st.Kept, "superseded", st.Superseded, "took", time.Since(start))
	if qerr != nil {
		qerr.Message = "restore refused: " + qerr.Message + "; nothing changed"
		return qerr
	}
	return rewind()
}

// restorePreviewMax bounds the records (leases and sessions of the file
// and of the running state) up to which the leader dry-runs a restore
// against the running state before sending it (a variable for tests):
// the dry run holds writes for a time that grows with both states.
var restorePreviewMax = 50_000

// restoreWindow is how many restore chunks are in flight at once.
const restoreWindow = 16

// sendRestoreChunks proposes the body read from src as the chunks of
// restore id, restoreWindow at a time, and returns their count once every
// one is committed and applied here. Any failure is UNAVAILABLE (or
// NO_LEADER): without its commit, the staged chunks change nothing.
func (bk *backups) sendRestoreChunks(ctx context.Context, id string, src io.Reader) (uint64, error) {
	type inflight struct {
		fut cluster.ApplyFuture
		seq uint64
	}
	var pending []inflight
	wait := func(p inflight) error {
		err := p.fut.Error()
		if err == nil {
			if rs, _ := p.fut.Response().([]fsm.Result); len(rs) == 1 && rs[0].Err != nil {
				err = rs[0].Err
			}
		}
		if err != nil {
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				return bk.noLeader()
			}
			return &wire.Error{Code: wire.CodeUnavailable, Message: fmt.Sprintf("restore chunk %d was not applied (%v); nothing changed", p.seq, err)}
		}
		bk.markRestoreProgress()
		return nil
	}
	buf := make([]byte, fsm.MaxRestoreChunk)
	var seq uint64
	for ; ; seq++ {
		m, rerr := io.ReadFull(src, buf)
		if m == 0 {
			break
		}
		if rerr != nil && rerr != io.ErrUnexpectedEOF {
			return 0, &wire.Error{Code: wire.CodeInternal, Message: "read the restore spool: " + rerr.Error()}
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !bk.cl.IsLeader() {
			return 0, bk.noLeader()
		}
		data, err := bk.gc.encode(&fsm.RestoreChunk{ID: id, Seq: seq, Data: buf[:m], CRC: fsm.ChunkCRC(buf[:m])})
		if err != nil {
			return 0, &wire.Error{Code: wire.CodeInternal, Message: "encode a restore chunk: " + err.Error()}
		}
		if len(pending) == restoreWindow {
			if err := wait(pending[0]); err != nil {
				return 0, err
			}
			pending = pending[1:]
		}
		pending = append(pending, inflight{fut: bk.cl.Apply(data, bk.cfg.ApplyTimeout), seq: seq})
		if seq == 0 {
			bk.restoreHook("first-chunk")
		}
	}
	for _, p := range pending {
		if err := wait(p); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

// applyRestoreEntry proposes a restore entry and waits until it is applied
// here. The commit's failures after it may have been appended are
// INDETERMINATE; those that prove it never was are NO_LEADER or
// UNAVAILABLE.
func (bk *backups) applyRestoreEntry(c fsm.Command) (fsm.Result, uint64, error) {
	data, err := bk.gc.encode(c)
	if err != nil {
		return fsm.Result{}, 0, &wire.Error{Code: wire.CodeInternal, Message: "encode the restore entry: " + err.Error()}
	}
	if !bk.cl.IsLeader() {
		return fsm.Result{}, 0, bk.noLeader()
	}
	fut := bk.cl.Apply(data, bk.cfg.ApplyTimeout)
	if err := fut.Error(); err != nil {
		switch e := cluster.ClassifyApply(err); {
		case e.Class == cluster.NotLeader:
			return fsm.Result{}, 0, bk.noLeader()
		case e.Class == cluster.Busy:
			return fsm.Result{}, 0, &wire.Error{Code: wire.CodeUnavailable, Message: "the restore commit was not proposed (" + err.Error() + "); nothing changed"}
		case errors.Is(err, raft.ErrRaftShutdown): // indeterminate, said its own way
			return fsm.Result{}, 0, &wire.Error{Code: wire.CodeIndeterminate, Message: "the server shut down while the restore commit was in flight; " +
				"every server applies it or none does: check the state (GET /v1/cluster/snapshot/info or the leases) before retrying"}
		}
		return fsm.Result{}, 0, &wire.Error{Code: wire.CodeIndeterminate, Message: "leadership was lost while the restore commit was in flight (" + err.Error() +
			"); every server applies it or none does: check the state before retrying"}
	}
	rs, _ := fut.Response().([]fsm.Result)
	if len(rs) != 1 {
		return fsm.Result{}, 0, &wire.Error{Code: wire.CodeInternal, Message: "missing apply result"}
	}
	return rs[0], fut.Index(), nil
}

// markRestoreProgress tells the leadership watchdog that a restore is
// making progress (restoreBusy).
func (bk *backups) markRestoreProgress() { bk.restoreAt.Store(int64(time.Since(processStart))) }

// restoreBusy reports whether a restore made progress within bound, or is
// being applied here now: the watchdog counts either as this term's
// progress (a large restore's commit applies for seconds, and ticks wait
// behind it).
func (bk *backups) restoreBusy(bound time.Duration) bool {
	at := bk.restoreAt.Load()
	return bk.rep.applyingRestore.Load() || bk.previewing.Load() || at != 0 && time.Since(processStart)-time.Duration(at) < bound
}

// restoreHook is a test's view of the restore's steps.
func (bk *backups) restoreHook(step string) {
	if h := bk.onRestoreStep; h != nil {
		h(step)
	}
}

// spoolFile creates a temporary file next to the Raft data (or in the
// system's temporary directory for an in-memory node).
func (bk *backups) spoolFile(what string) (*os.File, error) {
	dir := ""
	if !bk.cfg.InMemory {
		dir = bk.cfg.DataDir
	}
	f, err := os.CreateTemp(dir, ".snapshot-"+what+"-*.tmp")
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "create a spool file: " + err.Error()}
	}
	return f, nil
}

func removeSpool(f *os.File) {
	f.Close()
	os.Remove(f.Name())
}

func encodeSnapshotHeader(info *SnapshotInfo) ([]byte, error) { return wire.EncodeSnapshotHeader(info) }

// ReadSnapshotFile reads the header of a snapshot file from r and returns
// it with a reader of the body that verifies as it goes (see
// wire.ReadSnapshotFile).
func ReadSnapshotFile(r io.Reader) (*SnapshotInfo, io.Reader, error) { return wire.ReadSnapshotFile(r) }

// decodeSnapshotState decodes a verified body into a fresh state machine.
// A stream problem (truncation, checksum, a failing reader) is reported
// rather than the decoding error it usually causes first.
func decodeSnapshotState(body io.Reader) (*fsm.FSM, error) {
	f := fsm.New()
	derr := f.Restore(body)
	if _, err := io.Copy(io.Discard, body); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, badSnapshot("the state does not decode: %v", derr)
	}
	return f, nil
}

func stateSummary(f *fsm.FSM) *SnapshotState {
	leases, sessions := f.Counts()
	return &SnapshotState{Tick: f.Tick(), TickPeriodMS: f.PeriodMS(), FencingToken: f.Fence(),
		ActiveLeases: leases, ActiveSessions: sessions}
}

// InspectSnapshotFile reads a whole snapshot file from r and verifies it
// the way RestoreSnapshot does before it changes anything (format, size,
// checksum, and that the state decodes), and describes it with a summary
// of its state. It needs memory for the whole state.
func InspectSnapshotFile(r io.Reader) (*SnapshotInfo, error) {
	info, body, err := ReadSnapshotFile(r)
	if err != nil {
		return nil, err
	}
	f, err := decodeSnapshotState(body)
	if err != nil {
		return nil, err
	}
	info.State = stateSummary(f)
	return info, nil
}

// DowngradeSnapshotFile rewrites the snapshot file read from r for a
// rollback to the release before grant keys (see fsm.ForPreviousRelease),
// writing it to w; it returns the new file's info and how many servers'
// grant keys it dropped. It checks the file the way a restore would first
// and refuses a state the previous release cannot hold.
func DowngradeSnapshotFile(r io.Reader, w io.Writer) (*SnapshotInfo, int, error) {
	info, body, err := ReadSnapshotFile(r)
	if err != nil {
		return nil, 0, err
	}
	f, err := decodeSnapshotState(body)
	if err != nil {
		return nil, 0, err
	}
	dropped, err := f.ForPreviousRelease()
	if err != nil {
		return nil, 0, &wire.Error{Code: wire.CodeInvalidArgument, Message: err.Error()}
	}
	snap := f.Snapshot()
	h := sha256.New()
	size, err := snap.WriteTo(h)
	if err != nil {
		return nil, 0, err
	}
	out := *info
	out.Size, out.SHA256, out.State = size, hex.EncodeToString(h.Sum(nil)), stateSummary(f)
	hdr, err := wire.EncodeSnapshotHeader(&out)
	if err != nil {
		return nil, 0, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, 0, err
	}
	if _, err := snap.WriteTo(w); err != nil {
		return nil, 0, err
	}
	return &out, dropped, nil
}
