package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// Online backup and restore of the whole cluster state.
//
// A snapshot file is self-describing (package wire reads and writes its
// framing): a magic line, the file format, a JSON header line with the
// body's size and SHA-256, then the body, the state machine's snapshot
// (fsm.Snapshot.WriteTo), and nothing after it. A truncated or corrupted
// file is refused before anything changes.

// SnapshotFileFormat is the version of the snapshot file layout that
// SaveSnapshot writes and RestoreSnapshot reads (see package wire).
const SnapshotFileFormat = wire.SnapshotFileFormat

// SnapshotInfo describes a snapshot file; SnapshotState summarises the
// state in it.
type (
	SnapshotInfo  = wire.SnapshotInfo
	SnapshotState = wire.SnapshotState
)

func badSnapshot(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidArgument, Message: "invalid snapshot file: " + fmt.Sprintf(format, args...)}
}

// SaveSnapshot writes a snapshot file of the cluster's current state to w
// and describes it. Only the leader saves (elsewhere: NO_LEADER, naming the
// leader). The state is consistent: Raft takes the snapshot at one log
// index, after a barrier, so it holds every write acknowledged before the
// call. Nothing is written to w before the snapshot has been taken; an
// error after the first write means w holds a partial file.
func (n *Node) SaveSnapshot(ctx context.Context, w io.Writer) (*SnapshotInfo, error) {
	if n.cl.Raft.State() != raft.Leader || !n.isLeaderReady() {
		return nil, n.noLeader()
	}
	if err := n.awaitFirstTick(ctx); err != nil {
		return nil, err
	}
	fut, err := n.raftSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	meta, rc, err := fut.Open()
	if err != nil {
		return nil, &Error{Code: CodeInternal, Message: "open the snapshot: " + err.Error()}
	}
	defer rc.Close()
	// The header carries the body's checksum, so the body is spooled first.
	tmp, err := n.spoolFile("save")
	if err != nil {
		return nil, err
	}
	defer removeSpool(tmp)
	h := sha256.New()
	size, err := io.Copy(io.MultiWriter(tmp, h), rc)
	if err != nil {
		return nil, &Error{Code: CodeInternal, Message: "copy the snapshot: " + err.Error()}
	}
	if size != meta.Size {
		return nil, &Error{Code: CodeInternal, Message: fmt.Sprintf("the snapshot has %d bytes, its metadata says %d", size, meta.Size)}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	info := &SnapshotInfo{Format: SnapshotFileFormat, Index: meta.Index, Term: meta.Term,
		CreatedAt: wallNow().UTC(), NodeID: n.cfg.NodeID, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}
	hdr, err := encodeSnapshotHeader(info)
	if err != nil {
		return nil, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, &Error{Code: CodeInternal, Message: "rewind the snapshot spool: " + err.Error()}
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	// Check what is sent against the checksum in the header, so that a
	// spool that went bad is an error here rather than a file that fails
	// at restore time.
	h.Reset()
	sent, err := io.Copy(w, io.TeeReader(tmp, h))
	if err != nil {
		return nil, err
	}
	if sent != size || hex.EncodeToString(h.Sum(nil)) != info.SHA256 {
		return nil, &Error{Code: CodeInternal, Message: "the snapshot changed while it was being sent"}
	}
	n.log.Info("saved a snapshot", "index", info.Index, "term", info.Term, "bytes", info.Size)
	return info, nil
}

// awaitFirstTick waits until the state has recorded the cluster's tick
// period, which its first tick does (a new leader ticks one period after it
// is elected). A snapshot without it would not say how long its ticks are,
// and RestoreSnapshot could not refuse it in a cluster that ticks at
// another pace.
func (n *Node) awaitFirstTick(ctx context.Context) error {
	timer := time.NewTimer(n.cfg.ApplyTimeout)
	defer timer.Stop()
	for {
		ch, _ := n.rep.waitApplied()
		n.rep.mu.RLock()
		p := n.rep.f.PeriodMS()
		n.rep.mu.RUnlock()
		if p != 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return errShuttingDown()
		case <-timer.C:
			return &Error{Code: CodeUnavailable, Message: "the cluster has not ticked yet; try again"}
		}
	}
}

// raftSnapshot has Raft take a snapshot of the state as of now. A barrier
// comes first: it makes the state reflect every committed write, and it is
// a new entry, so Raft never answers that there is nothing new to snapshot
// (unless an automatic snapshot got in between: then it tries again).
func (n *Node) raftSnapshot(ctx context.Context) (raft.SnapshotFuture, error) {
	for attempt := 0; ; attempt++ {
		if err := n.cl.Raft.Barrier(n.cfg.ApplyTimeout).Error(); err != nil {
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				return nil, n.noLeader()
			}
			return nil, &Error{Code: CodeUnavailable, Message: "snapshot: barrier: " + err.Error()}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fut := n.cl.Raft.Snapshot()
		err := fut.Error()
		switch {
		case err == nil:
			return fut, nil
		case errors.Is(err, raft.ErrNothingNewToSnapshot) && attempt < 3:
			continue
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, errShuttingDown()
		}
		return nil, &Error{Code: CodeUnavailable, Message: "snapshot: " + err.Error()}
	}
}

// RestoreSnapshot restores the cluster state from a snapshot file read
// from r. Only the leader restores (elsewhere: NO_LEADER). The file is read
// and verified completely first (magic, format, size, checksum, and that
// the state decodes); a bad file is INVALID_ARGUMENT and changes nothing.
//
// A restore never goes backwards (fsm.FSM.Rebase decides, on the state
// applied just before the restore, with writes paused):
//   - what is live just before the restore stays as it is: every active
//     lease and session keeps its record, fencing token and deadline, and a
//     key in use (an active lease or a pending lock-delay) keeps its state,
//     so nobody else can take it while its holder may still believe it
//     holds it;
//   - the file's other leases come back, with the remaining time they had
//     when the file was saved, but each with a new fencing token above
//     every token issued before the restore: a token issued before the
//     restore is never valid again on a lease that was not live just
//     before it. The file's leases on keys in use (or bound to a session
//     that is live) do not come back: they end as revoked, reason
//     "restore". Sessions of the file that are not live come back too;
//   - the log: Raft installs the state at an index above every existing
//     one (raft.Raft.Restore), with the current configuration; followers
//     receive it as a snapshot;
//   - the clock: the tick never goes back (the file's deadlines move with
//     it);
//   - fencing tokens: the restored fencing counter is above every token
//     granted before the restore and every re-fenced one, so a lease
//     granted afterwards gets a higher token than any lease ever had;
//   - event ids: events after the restore have higher ids than every
//     event before; live event streams end with EVENTS_COMPACTED and a
//     resume from before the restore is refused the same way, since the
//     state they followed is gone;
//   - the member registry, which stays the cluster's current one.
//
// Queued acquires (wait_ms) are not restored: those in the file are
// withdrawn, and acquires waiting on this node fail with UNAVAILABLE.
// Writes are paused while the new state is installed.
func (n *Node) RestoreSnapshot(ctx context.Context, r io.Reader) (*SnapshotInfo, error) {
	if n.cl.Raft.State() != raft.Leader || !n.isLeaderReady() {
		return nil, n.noLeader()
	}
	info, body, err := ReadSnapshotFile(r)
	if err != nil {
		return nil, err
	}
	f, err := decodeSnapshotState(body)
	if err != nil {
		return nil, err
	}
	info.State = stateSummary(f)
	if p, cur := f.PeriodMS(), n.period().Milliseconds(); p != 0 && p != cur {
		// Ticks count every TTL; the leader would keep ticking at its own
		// period, so time would run at the wrong speed.
		return nil, badSnapshot("its tick period is %dms; this cluster ticks every %dms", p, cur)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// No write may be applied between reading the fencing counter and the
	// restore, or a token granted meanwhile could be handed out again.
	resume, err := n.pauseWrites(ctx)
	if err != nil {
		return nil, err
	}
	defer resume()
	if n.cl.Raft.State() != raft.Leader {
		return nil, n.noLeader()
	}
	n.rep.mu.RLock()
	before := n.rep.f
	st := f.RebaseStats(before, max(n.cl.Raft.LastIndex(), before.Index()))
	info.DroppedWaits, info.Refenced, info.Kept, info.Superseded = st.DroppedWaits, st.Refenced, st.Kept, st.Superseded
	n.rep.mu.RUnlock()
	index := f.Index()

	tmp, err := n.spoolFile("restore")
	if err != nil {
		return nil, err
	}
	defer removeSpool(tmp)
	size, err := f.Snapshot().WriteTo(tmp)
	if err != nil {
		return nil, &Error{Code: CodeInternal, Message: "encode the state to restore: " + err.Error()}
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, &Error{Code: CodeInternal, Message: "rewind the restore spool: " + err.Error()}
	}

	// No timeout: a timer that fires while a large state is being
	// installed would make Raft report a failure after the fact. Raft's
	// main loop takes the restore at once, or answers ErrNotLeader.
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: index, Term: info.Term, Size: size}
	term := n.cl.Raft.CurrentTerm()
	rerr := n.cl.Raft.Restore(meta, tmp, 0)
	n.rep.mu.RLock()
	restored := n.rep.f != before // only a restore replaces the state machine
	n.rep.mu.RUnlock()
	if restored {
		n.failWaiters()
	}
	if rerr != nil && restored && errors.Is(rerr, raft.ErrLeadershipLost) && n.restoreConfirmed(ctx, term) {
		// Followers busy installing the restored state can miss the
		// leader's lease check: it stepped down and won the next term.
		rerr = nil
	}
	if rerr != nil {
		switch {
		case restored:
			return nil, &Error{Code: CodeIndeterminate, Message: "the snapshot was installed on this node but the cluster did not confirm it (" +
				rerr.Error() + "); check the state before retrying"}
		case errors.Is(rerr, raft.ErrNotLeader):
			return nil, n.noLeader()
		case errors.Is(rerr, raft.ErrRaftShutdown):
			return nil, errShuttingDown()
		}
		return nil, &Error{Code: CodeUnavailable, Message: "restore failed, nothing changed: " + rerr.Error()}
	}
	info.RestoredIndex = index + 1
	if s, err := strconv.ParseUint(n.cl.Raft.Stats()["last_snapshot_index"], 10, 64); err == nil && s > index {
		info.RestoredIndex = s
	}
	n.log.Warn("restored the cluster state from a snapshot",
		"snapshot_index", info.Index, "snapshot_created_at", info.CreatedAt, "snapshot_node", info.NodeID,
		"restored_index", info.RestoredIndex, "active_leases", info.State.ActiveLeases, "dropped_waits", info.DroppedWaits,
		"refenced", info.Refenced, "kept", info.Kept, "superseded", info.Superseded)
	return info, nil
}

// restoreConfirmed reports whether a restore installed on this server
// while it led term, whose confirming entry was lost with its leadership,
// is part of the cluster's log after all: this server leads again in the
// very next term (so no other server led in between) and commits a barrier
// in it, which a majority acknowledges only with this server's log,
// restored snapshot included. It waits a few election timeouts at most.
func (n *Node) restoreConfirmed(ctx context.Context, term uint64) bool {
	deadline := time.Now().Add(max(5*time.Second, 10*n.cfg.raftTimeout))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		switch cur := n.cl.Raft.CurrentTerm(); {
		case cur > term+1:
			return false
		case cur == term+1 && n.cl.Raft.State() == raft.Leader:
			if n.cl.Raft.Barrier(time.Until(deadline)).Error() != nil {
				return false
			}
			return n.cl.Raft.CurrentTerm() == term+1
		case cur == term+1 && n.cl.Raft.State() == raft.Follower:
			if addr, _ := n.cl.Raft.LeaderWithID(); addr != "" {
				return false // another server leads the next term
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// pauseWrites stops the batcher from handing entries to Raft and waits for
// the entries in flight to be applied, by taking every in-flight slot. The
// returned function gives them back. Proposals made meanwhile queue up and
// are applied afterwards.
func (n *Node) pauseWrites(ctx context.Context) (func(), error) {
	timer := time.NewTimer(n.cfg.ApplyTimeout)
	defer timer.Stop()
	held := 0
	resume := func() {
		for range held {
			<-n.inflight
		}
	}
	for held < cap(n.inflight) {
		select {
		case n.inflight <- struct{}{}:
			held++
			continue
		case <-ctx.Done():
			resume()
			return nil, ctx.Err()
		case <-n.closing:
			resume()
			return nil, errShuttingDown()
		case <-timer.C:
			resume()
			return nil, &Error{Code: CodeUnavailable, Message: "writes did not pause in time for the restore; nothing changed"}
		}
	}
	return resume, nil
}

// failWaiters answers every acquire waiting on this node for a slot: the
// restore replaced the queue it waited in. (A waiter whose acquire is
// still to be proposed listens again when it is queued; see awaitGrant.)
func (n *Node) failWaiters() {
	n.waitMu.Lock()
	ns := make([]fsm.Notice, 0, len(n.waiters))
	for id := range n.waiters {
		ns = append(ns, fsm.Notice{LeaseID: id, Err: &Error{Code: CodeUnavailable,
			Message: "the cluster state was restored from a snapshot while this acquire waited; it was not granted"}})
	}
	n.waitMu.Unlock()
	n.deliverNotices(ns)
}

// spoolFile creates a temporary file next to the Raft data (or in the
// system's temporary directory for an in-memory node).
func (n *Node) spoolFile(what string) (*os.File, error) {
	dir := ""
	if !n.cfg.InMemory {
		dir = n.cfg.DataDir
	}
	f, err := os.CreateTemp(dir, ".snapshot-"+what+"-*.tmp")
	if err != nil {
		return nil, &Error{Code: CodeInternal, Message: "create a spool file: " + err.Error()}
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
