package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
)

// Online backup and restore of the whole cluster state.
//
// A snapshot file is self-describing:
//
//	LEASEHOLD-SNAPSHOT\n        the magic line
//	1\n                         the file format (SnapshotFileFormat)
//	{"index":...,...}\n         the JSON header (snapshotFileHeader), one line
//	<size bytes>                the state machine's snapshot (fsm.Snapshot.WriteTo)
//
// and nothing after the body. The header carries the body's size and
// SHA-256, so a truncated or corrupted file is refused before anything
// changes.

// SnapshotFileFormat is the version of the snapshot file layout that
// SaveSnapshot writes and RestoreSnapshot reads. (The body has its own
// format number, that of the state machine's snapshots.)
const SnapshotFileFormat = 1

const (
	snapshotFileMagic = "LEASEHOLD-SNAPSHOT"
	// maxSnapshotHeader bounds the JSON header line.
	maxSnapshotHeader = 64 << 10
)

// SnapshotInfo describes a snapshot file: what its header says and, once
// the state in it was decoded, a summary of that state.
type SnapshotInfo struct {
	// Format is the file format (SnapshotFileFormat).
	Format int `json:"format"`
	// Index and Term are the Raft index and term of the saved state.
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
	// CreatedAt is when the snapshot was saved (the saving node's clock).
	CreatedAt time.Time `json:"created_at"`
	// NodeID is the server that saved it (the leader at the time).
	NodeID string `json:"node_id"`
	// Size is the length of the body (the state), in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of the body.
	SHA256 string `json:"sha256"`
	// State summarises the saved state; set by RestoreSnapshot and
	// InspectSnapshotFile, which decode it.
	State *SnapshotState `json:"state,omitempty"`
	// RestoredIndex is the Raft index at which the cluster continues from
	// the restored state (RestoreSnapshot only): above every index before
	// the restore.
	RestoredIndex uint64 `json:"restored_index,omitempty"`
	// DroppedWaits counts the queued acquires of the file that the restore
	// withdrew (RestoreSnapshot only).
	DroppedWaits int `json:"dropped_waits,omitempty"`
	// Refenced counts the leases of the file active after the restore,
	// each with a new fencing token; Kept the leases live before the
	// restore, kept as they were; Superseded the leases of the file not
	// brought back because their key or session was live (RestoreSnapshot
	// only).
	Refenced   int `json:"refenced,omitempty"`
	Kept       int `json:"kept,omitempty"`
	Superseded int `json:"superseded,omitempty"`
}

// SnapshotState summarises the state in a snapshot.
type SnapshotState struct {
	// Tick and TickPeriodMS are the cluster clock at the time of the save.
	Tick         uint64 `json:"tick"`
	TickPeriodMS int64  `json:"tick_period_ms"`
	// FencingToken is the highest fencing token granted up to the save.
	FencingToken   uint64 `json:"fencing_token"`
	ActiveLeases   int    `json:"active_leases"`
	ActiveSessions int    `json:"active_sessions"`
}

// snapshotFileHeader is the JSON header line of a snapshot file.
type snapshotFileHeader struct {
	Index     uint64    `json:"index"`
	Term      uint64    `json:"term"`
	CreatedAt time.Time `json:"created_at"`
	NodeID    string    `json:"node_id"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
}

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
	rerr := n.cl.Raft.Restore(meta, tmp, 0)
	n.rep.mu.RLock()
	restored := n.rep.f != before // only a restore replaces the state machine
	n.rep.mu.RUnlock()
	if restored {
		n.failWaiters()
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

func encodeSnapshotHeader(info *SnapshotInfo) ([]byte, error) {
	js, err := json.Marshal(snapshotFileHeader{Index: info.Index, Term: info.Term, CreatedAt: info.CreatedAt,
		NodeID: info.NodeID, Size: info.Size, SHA256: info.SHA256})
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%d\n%s\n", snapshotFileMagic, SnapshotFileFormat, js)
	return b.Bytes(), nil
}

// ReadSnapshotFile reads the header of a snapshot file from r and returns
// it with a reader of the body. The body reader verifies as it goes: it
// fails, with an INVALID_ARGUMENT *Error, on a body shorter than the
// header says, on data after the body, or on a checksum mismatch, and
// returns io.EOF only once all of it checked out. Errors of r itself are
// passed on as they are.
func ReadSnapshotFile(r io.Reader) (*SnapshotInfo, io.Reader, error) {
	br := bufio.NewReaderSize(r, maxSnapshotHeader+1)
	magic, err := br.Peek(len(snapshotFileMagic) + 1)
	if err != nil && !isEOF(err) {
		return nil, nil, err
	}
	if string(magic) != snapshotFileMagic+"\n" {
		return nil, nil, badSnapshot("not a Leasehold snapshot (bad magic; expected a file written by 'leasehold snapshot save')")
	}
	br.Discard(len(magic))
	line, err := readHeaderLine(br, 32, "format line")
	if err != nil {
		return nil, nil, err
	}
	format, perr := strconv.Atoi(string(line))
	if perr != nil || format < 1 {
		return nil, nil, badSnapshot("malformed format line %q", line)
	}
	if format != SnapshotFileFormat {
		return nil, nil, badSnapshot("file format %d is not supported (this server reads format %d)", format, SnapshotFileFormat)
	}
	line, err = readHeaderLine(br, maxSnapshotHeader, "header")
	if err != nil {
		return nil, nil, err
	}
	var hdr snapshotFileHeader
	if err := json.Unmarshal(line, &hdr); err != nil {
		return nil, nil, badSnapshot("malformed header: %v", err)
	}
	sum, herr := hex.DecodeString(hdr.SHA256)
	switch {
	case herr != nil || len(sum) != sha256.Size:
		return nil, nil, badSnapshot("malformed header: sha256 must be 64 hex digits")
	case hdr.Size <= 0:
		return nil, nil, badSnapshot("malformed header: size must be positive, got %d", hdr.Size)
	}
	info := &SnapshotInfo{Format: format, Index: hdr.Index, Term: hdr.Term, CreatedAt: hdr.CreatedAt,
		NodeID: hdr.NodeID, Size: hdr.Size, SHA256: hdr.SHA256}
	return info, &snapshotBody{r: br, size: hdr.Size, left: hdr.Size, h: sha256.New(), want: sum}, nil
}

// readHeaderLine reads one line of at most limit bytes (without the newline).
func readHeaderLine(br *bufio.Reader, limit int, what string) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case err == nil && len(line) <= limit+1:
		return line[:len(line)-1], nil
	case err == nil, errors.Is(err, bufio.ErrBufferFull):
		return nil, badSnapshot("the %s is longer than %d bytes", what, limit)
	case isEOF(err):
		return nil, badSnapshot("the file ends in its %s (truncated)", what)
	}
	return nil, err
}

func isEOF(err error) bool { return err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) }

// snapshotBody reads and verifies the body of a snapshot file.
type snapshotBody struct {
	r          *bufio.Reader
	size, left int64
	h          hash.Hash
	want       []byte
	err        error // sticky: io.EOF once verified
}

func (b *snapshotBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.left == 0 {
		b.err = b.finish()
		return 0, b.err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	b.left -= int64(n)
	switch {
	case err == nil || err == io.EOF && b.left == 0:
		return n, nil
	case isEOF(err):
		b.err = badSnapshot("the body ends after %d of its %d bytes (truncated)", b.size-b.left, b.size)
	default:
		b.err = err
	}
	return n, b.err
}

// finish checks, once the whole body was read, that nothing follows it and
// that its checksum is the header's.
func (b *snapshotBody) finish() error {
	var one [1]byte
	switch n, err := io.ReadFull(b.r, one[:]); {
	case n > 0:
		return badSnapshot("data after the %d bytes of the body", b.size)
	case !isEOF(err):
		return err
	}
	if !bytes.Equal(b.h.Sum(nil), b.want) {
		return badSnapshot("checksum mismatch: the body is not the one the header describes (corrupted)")
	}
	return io.EOF
}

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
