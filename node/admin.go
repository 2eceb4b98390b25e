package node

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The cluster as an operator sees and changes it: its status, removing a
// member, moving leadership. None of these ends or shortens a lease.

// ClusterStatus describes the cluster as this node sees it.
//
// With stale false the read is linearizable (only the leader answers, after
// confirming its leadership), so its tick is at least every tick committed
// before the call: the chaos suite's clock checker relies on that. With
// stale true it is this node's own view, whatever its role.
func (n *Node) ClusterStatus(ctx context.Context, stale bool) (*wire.ClusterStatus, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	r := n.cl
	st := r.Stats()
	term, _ := strconv.ParseUint(st["term"], 10, 64)
	leaderAddr, leaderID := r.Leader()
	n.rep.mu.RLock()
	tick, period := n.rep.f.Tick(), n.rep.period()
	leases, sessions := n.rep.f.Counts()
	n.rep.mu.RUnlock()
	out := &wire.ClusterStatus{
		NodeID: n.cfg.NodeID, Leader: string(leaderID), LeaderAddr: string(leaderAddr),
		State: string(r.State()), Term: term, CommitIndex: r.CommitIndex(),
		AppliedIndex: n.rep.applied.Load(), Tick: tick, TickPeriodMS: period,
		ActiveLeases: leases, ActiveSession: sessions,
	}
	conf, err := r.Configuration()
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "read raft configuration: " + err.Error()}
	}
	out.Members = n.rc.members(conf, leaderID)
	return out, nil
}

// RemoveMember removes a server from the Raft configuration. It never ends
// or shortens a lease. Only the leader can do it. The removed server is not
// re-added while it runs with the same data directory.
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	r := n.cl
	if !r.IsLeader() {
		return n.noLeader()
	}
	conf, err := r.Configuration()
	if err != nil {
		return &wire.Error{Code: wire.CodeInternal, Message: err.Error()}
	}
	found := false
	for _, s := range conf.Servers {
		found = found || string(s.ID) == id
	}
	if !found {
		return &wire.Error{Code: wire.CodeNotFound, Message: "no member " + strconv.Quote(id)}
	}
	if id == n.cfg.NodeID && len(conf.Servers) == 1 {
		return fsm.InvalidField("id", "cannot remove the only member of the cluster")
	}
	// Tombstone the server's data directory first: if it comes back, it is
	// not re-added (wiping its data directory lets it join anew).
	return n.rc.removeServer(ctx, id)
}

// TransferLeadership asks the leader to hand over to id (any up-to-date
// voter when id is empty).
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	r := n.cl
	if !r.IsLeader() {
		return n.noLeader()
	}
	var err error
	if id == "" {
		err = r.TransferLeadership()
	} else {
		conf, cerr := r.Configuration()
		if cerr != nil {
			return &wire.Error{Code: wire.CodeInternal, Message: cerr.Error()}
		}
		var addr string
		for _, s := range conf.Servers {
			if s.ID == id {
				addr = s.Address
			}
		}
		if addr == "" {
			return &wire.Error{Code: wire.CodeNotFound, Message: "no member " + strconv.Quote(id)}
		}
		err = r.TransferLeadershipTo(id, addr)
	}
	if err != nil {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "leadership transfer failed: " + err.Error()}
	}
	return nil
}

// SaveSnapshot writes a snapshot file of the cluster's current state to w
// and describes it. Only the leader saves (elsewhere: NO_LEADER, naming the
// leader). The state is consistent: Raft takes the snapshot at one log
// index, after a barrier, so it holds every write acknowledged before the
// call. Nothing is written to w before the snapshot has been taken; an
// error after the first write means w holds a partial file.
func (n *Node) SaveSnapshot(ctx context.Context, w io.Writer) (*SnapshotInfo, error) {
	if !n.cl.IsLeader() || !n.lt.isReady() {
		return nil, n.noLeader()
	}
	if err := n.bk.awaitFirstTick(ctx); err != nil {
		return nil, err
	}
	fut, err := n.bk.raftSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	meta, rc, err := fut.Open()
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "open the snapshot: " + err.Error()}
	}
	defer rc.Close()
	// The header carries the body's size and checksum, which Persist
	// recorded when it wrote the snapshot (Raft has just taken it, here).
	sum, ok := n.rep.sums.get(meta.ID)
	if !ok || sum.size != meta.Size {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: fmt.Sprintf("the checksum of snapshot %s (%d bytes) was not recorded when it was written", meta.ID, meta.Size)}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	info := &SnapshotInfo{Format: SnapshotFileFormat, Index: meta.Index, Term: meta.Term,
		CreatedAt: wallNow().UTC(), NodeID: n.cfg.NodeID, Size: sum.size, SHA256: hex.EncodeToString(sum.sha256[:])}
	hdr, err := encodeSnapshotHeader(info)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	// A snapshot that changed on disk since it was written is an error
	// here rather than a file that fails at restore time.
	h := sha256.New()
	sent, err := io.Copy(w, io.TeeReader(rc, h))
	if err != nil {
		return nil, err
	}
	if sent != sum.size || [sha256.Size]byte(h.Sum(nil)) != sum.sha256 {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "the snapshot changed on disk while it was being sent"}
	}
	n.log.Info("saved a snapshot", "index", info.Index, "term", info.Term, "bytes", info.Size)
	return info, nil
}

// RestoreSnapshot restores the cluster state from a snapshot file read
// from r. Only the leader restores (elsewhere: NO_LEADER). The file is read
// and verified completely first (magic, format, size, checksum, that the
// state decodes, its tick period); a bad file is INVALID_ARGUMENT and
// changes nothing.
//
// A restore travels through the Raft log (fsm/restore.go): it happens on
// every server at one index, or on none. Writes go on meanwhile. A restore
// never goes backwards (fsm.FSM.Rebase says how): what is live just before
// it stays as it is, fencing tokens, the tick and event ids only move
// forward, and live event streams end with EVENTS_COMPACTED.
//
// Queued acquires (wait_ms) are not restored: those in the file are
// withdrawn, and those waiting when the restore applies fail with
// UNAVAILABLE, on whichever server they wait.
//
// The answer: the file's description with what the restore did, once the
// commit entry is committed and applied here. UNAVAILABLE or NO_LEADER:
// nothing changed (chunks without their commit are dropped). INDETERMINATE:
// leadership was lost after the commit was proposed; every server applies
// it, or none does, as the log decides.
func (n *Node) RestoreSnapshot(ctx context.Context, r io.Reader) (*SnapshotInfo, error) {
	return n.RestoreSnapshotWith(ctx, r, wire.RestoreOptions{})
}

// RestoreSnapshotWith is RestoreSnapshot with options: with a FenceFloor,
// every lease the restore brings back and every lease granted after it
// gets a fencing token above the floor as well.
//
// Before it reads the body, the leader checks that every voter has the
// disk and memory the restore needs (admission.go), from the file's
// header and the current state's counts: otherwise UNAVAILABLE with the
// reason. After it has decoded the file, it rebases it against the
// current state as a dry run (fsm.FSM.PreviewRestore) and refuses a
// result over the count limits (--max-leases, --max-sessions, per holder)
// with RESOURCE_EXHAUSTED naming the limit. The commit carries the limits
// and the floor, and every server's apply holds the restore to them
// again: a commit whose result would exceed them changes nothing.
func (n *Node) RestoreSnapshotWith(ctx context.Context, r io.Reader, opts wire.RestoreOptions) (*SnapshotInfo, error) {
	if !n.cl.IsLeader() || !n.lt.isReady() {
		return nil, n.noLeader()
	}
	if err := n.bk.restoreSupported(); err != nil {
		return nil, err
	}
	n.bk.restoreMu.Lock()
	defer n.bk.restoreMu.Unlock()
	info, body, err := ReadSnapshotFile(r)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(body, 64<<10)
	counts, ok := fsm.PeekSnapshotCounts(br)
	if err := n.bk.admitRestore(info.Size, counts, ok); err != nil {
		return nil, err
	}
	// The body is spooled (the reader verifies its size and checksum as it
	// goes), decoded once to check it, and then read again to be sent.
	tmp, err := n.bk.spoolFile("restore")
	if err != nil {
		return nil, err
	}
	defer removeSpool(tmp)
	if _, err := io.Copy(tmp, br); err != nil {
		return nil, err
	}
	quota := n.cfg.quota()
	if err := n.bk.checkRestoreBody(tmp, info, quota, opts.FenceFloor); err != nil {
		return nil, err
	}
	var sum fsm.Hash
	if b, err := hex.DecodeString(info.SHA256); err != nil || len(b) != len(sum) {
		return nil, badSnapshot("bad sha256 in the header")
	} else {
		copy(sum[:], b)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := newID("rs_")
	chunks, err := n.bk.sendRestoreChunks(ctx, id, tmp)
	if err != nil {
		return nil, err
	}
	n.bk.restoreHook("chunks-sent")
	// The id is what an operator gives --skip-restore should no server be
	// able to apply the commit (docs/operations.md).
	n.log.Warn("committing a restore", "restore_id", id, "chunks", chunks, "bytes", info.Size, "fence_floor", opts.FenceFloor)
	res, index, err := n.bk.applyRestoreEntry(&fsm.RestoreCommit{ID: id, Chunks: chunks, Size: uint64(info.Size), SHA256: sum,
		Quota: quota, FenceFloor: opts.FenceFloor})
	n.bk.restoreHook("committed")
	if err != nil {
		var e *wire.Error
		if errors.As(err, &e) && e.Code == wire.CodeIndeterminate {
			c := *e
			c.Message += " (restore id " + id + ")"
			return nil, &c
		}
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	if res.Restore == nil {
		return nil, &wire.Error{Code: wire.CodeInternal, Message: "the restore commit applied without a result"}
	}
	st := res.Restore
	info.DroppedWaits, info.Refenced, info.Kept, info.Superseded = st.DroppedWaits, st.Refenced, st.Kept, st.Superseded
	info.RestoredIndex = index
	n.log.Warn("restored the cluster state from a snapshot",
		"snapshot_index", info.Index, "snapshot_created_at", info.CreatedAt, "snapshot_node", info.NodeID,
		"restored_index", info.RestoredIndex, "chunks", chunks, "active_leases", info.State.ActiveLeases,
		"dropped_waits", info.DroppedWaits, "refenced", info.Refenced, "kept", info.Kept, "superseded", info.Superseded)
	return info, nil
}
