package fsm

import (
	"crypto/sha256"
	"hash/crc32"
	"io"

	"github.com/leasehold/leasehold/wire"
)

// Restore through the log. An operator's restore travels through the Raft
// log like every other change, so that every replica applies it at the
// same index, from the same bytes, with the same code, or none does:
//
//   - the leader proposes the snapshot file's body as a sequence of
//     RestoreChunk entries (at most MaxRestoreChunk bytes each, each with
//     a CRC-32C of its bytes, all naming one restore id it decided);
//   - every replica stages the chunks of the restore in its state (they
//     are part of the state: a Raft snapshot taken meanwhile carries them,
//     so a replica that catches up by snapshot has them too);
//   - one RestoreCommit entry names the restore id, the number of chunks,
//     their total size and the SHA-256 of their concatenation. Applying it
//     checks all three, decodes the staged bytes, ends what is due in both
//     states (RestoreCommit.apply), and rebases the decoded state against
//     the running one (Rebase) at the commit's index. Anything that does
//     not check out changes nothing but the staging, which is dropped;
//   - chunks that no commit follows are dropped: by the next restore's
//     first chunk, by a commit of another id, or when no chunk has come
//     for RestoreStaleMS of cluster time (ticks).
//
// Everything is decided by the log alone, so replicas never disagree about
// whether, where, or to what a restore happened.

// Command types of a restore through the log (values are part of the log
// format).
const (
	// TypeRestoreChunk is a RestoreChunk entry.
	TypeRestoreChunk Type = 18
	// TypeRestoreCommit is a RestoreCommit entry.
	TypeRestoreCommit Type = 19
	// TypeRestoreCommitBounded is a RestoreCommit that carries a Quota or
	// a FenceFloor (a version-4 body: the fields of TypeRestoreCommit,
	// then the Quota and the FenceFloor).
	TypeRestoreCommitBounded Type = 28
)

// MaxRestoreChunk bounds the bytes of one RestoreChunk: small enough that
// the most entries Raft sends a lagging follower in one request (256) stay
// a few MiB, so that heartbeats and leases keep their pace.
const MaxRestoreChunk = 64 << 10

// MaxRestoreBytes bounds a restore's staged bytes (the snapshot body).
const MaxRestoreBytes = 64 << 30

// RestoreStaleMS is how long (in cluster time) staged chunks wait for the
// next chunk or their commit before they are dropped.
const RestoreStaleMS = 60_000

// MaxRestoreIDBytes bounds a restore id.
const MaxRestoreIDBytes = 64

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChunkCRC is the checksum a RestoreChunk carries: the CRC-32C of data.
func ChunkCRC(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

// RestoreChunk is one piece of a restore's snapshot body.
type RestoreChunk struct {
	// ID names the restore (1-64 bytes of printable ASCII); the proposing
	// server decides it.
	ID string `json:"id"`
	// Seq numbers the chunks from 0; the chunk with Seq 0 starts the
	// restore (and drops any other staged one).
	Seq uint64 `json:"seq"`
	// Data is 1..MaxRestoreChunk bytes of the body.
	Data []byte `json:"data"`
	// CRC is ChunkCRC(Data). An entry whose data does not match it does
	// not decode: the log was damaged on this server, which must stop
	// rather than apply it.
	CRC uint32 `json:"crc"`
}

// RestoreCommit applies the staged restore of ID.
type RestoreCommit struct {
	ID string `json:"id"`
	// Chunks and Size are the count and total bytes of the chunks, and
	// SHA256 the hash of their concatenation (the snapshot file's body).
	Chunks uint64 `json:"chunks"`
	Size   uint64 `json:"size"`
	SHA256 Hash   `json:"sha256"`
	// Quota is the proposing server's count limits (Leases, HolderLeases,
	// Sessions, HolderSessions; the waiter limits are ignored, a restore
	// leaves no waiter): a restore whose result would exceed one of them
	// changes nothing (RESOURCE_EXHAUSTED), on every replica alike.
	Quota Quota `json:"quota,omitzero"`
	// FenceFloor is a fencing token the restored fencing counter starts
	// above, with the file's and the running state's: the last token of
	// the cluster the file was saved from, when that cluster issued tokens
	// after the save (a disaster recovery, a rollback). 0: none.
	FenceFloor uint64 `json:"fence_floor,omitempty"`
	// Skip is never in the log: the applying server sets it to apply the
	// commit as a refusal that changes nothing but dropping the staging
	// (the operator's way out of a committed restore that cannot be
	// applied: node.Config.SkipRestore). Replicas stay identical only if
	// every one of them skips it.
	Skip bool `json:"-"`
}

// Type implements Command.
func (*RestoreChunk) Type() Type { return TypeRestoreChunk }

// Type implements Command: TypeRestoreCommitBounded when c carries a Quota
// or a FenceFloor.
func (c *RestoreCommit) Type() Type {
	if c.bounded() {
		return TypeRestoreCommitBounded
	}
	return TypeRestoreCommit
}

func (c *RestoreCommit) bounded() bool { return c.Quota != (Quota{}) || c.FenceFloor != 0 }

func validRestoreID(id string) *wire.Error {
	return validPrintable("restore id", id, MaxRestoreIDBytes)
}

// A decoded chunk's Data is a view of the entry (no copy): the entry's
// bytes are never changed once in the log, and a restore's chunks are large.
func (c *RestoreChunk) fields(f fields) {
	f.str(&c.ID)
	f.uvarint(&c.Seq)
	if d := f.d; d != nil {
		c.Data = d.take(d.count(1))
	} else {
		f.e.bytes(c.Data)
	}
	f.uint32(&c.CRC)
	d := f.d
	if d == nil || d.err != nil {
		return
	}
	switch {
	case validRestoreID(c.ID) != nil:
		d.fail("restore chunk: bad restore id")
	case len(c.Data) == 0 || len(c.Data) > MaxRestoreChunk:
		d.fail("restore chunk: data must be 1-" + itoa(MaxRestoreChunk) + " bytes")
	case ChunkCRC(c.Data) != c.CRC:
		d.fail("restore chunk: the data does not match its checksum")
	}
}

// A TypeRestoreCommitBounded body (bounded) is a TypeRestoreCommit body,
// the Quota and FenceFloor.
func (c *RestoreCommit) fields(f fields, bounded bool) {
	f.str(&c.ID)
	f.uvarint(&c.Chunks)
	f.uvarint(&c.Size)
	f.hash(&c.SHA256)
	if bounded {
		c.Quota.fields(f)
		f.uvarint(&c.FenceFloor)
		f.reject(!c.bounded(), "bounded restore commit: no quota and no fence floor") // one encoding per command
	}
	f.reject(f.d != nil && validRestoreID(c.ID) != nil, "restore commit: bad restore id")
}

// restoreStage is a restore's chunks received so far.
type restoreStage struct {
	id     string
	chunks [][]byte
	size   uint64
	last   uint64 // the tick of the last chunk
}

// staging owns the restore being received (nil when none): RestoreChunk
// entries add to it, a tick drops it when stale, RestoreCommit takes it.
type staging struct {
	*core
	stage *restoreStage
}

// Staged describes the restore staged, if any: its id, its chunks and
// bytes so far.
func (st *staging) Staged() (id string, chunks int, size uint64) {
	if st.stage == nil {
		return "", 0, 0
	}
	return st.stage.id, len(st.stage.chunks), st.stage.size
}

func (st *staging) restoreChunk(c *RestoreChunk) Result {
	if err := validRestoreID(c.ID); err != nil {
		return Result{Err: err}
	}
	s := st.stage
	if c.Seq == 0 {
		s = &restoreStage{id: c.ID}
		st.stage = s
	} else if s == nil || s.id != c.ID || c.Seq != uint64(len(s.chunks)) {
		if s != nil && s.id == c.ID {
			st.stage = nil // a gap: this restore can no longer commit
		}
		return Result{Err: Errorf(wire.CodeUnavailable, "restore %s: chunk %d is not the next one of a staged restore", c.ID, c.Seq)}
	}
	if s.size+uint64(len(c.Data)) > MaxRestoreBytes {
		st.stage = nil
		return Result{Err: Errorf(wire.CodePayloadTooLarge, "restore %s: more than %d bytes", c.ID, uint64(MaxRestoreBytes))}
	}
	s.chunks = append(s.chunks, c.Data)
	s.size += uint64(len(c.Data))
	s.last = st.tick
	return Result{}
}

// dropStaleStage drops a staged restore that has had no chunk for
// RestoreStaleMS (a tick applies it).
func (st *staging) dropStaleStage() {
	if st.stage == nil {
		return
	}
	period := st.periodMS
	if period <= 0 {
		period = 100
	}
	if st.tick-st.stage.last > uint64(RestoreStaleMS/period) {
		st.stage = nil
	}
}

// restoreCommit applies a staged restore (see the top of this file). The
// state after it is the backup's rebased against the running one (Rebase),
// at the commit's index; every queued acquire is withdrawn, and the
// running state's are answered with a notice.
func (f *FSM) restoreCommit(c *RestoreCommit) Result {
	s := f.stage
	f.stage = nil
	if s == nil || s.id != c.ID {
		return Result{Err: Errorf(wire.CodeUnavailable, "restore %s: nothing staged (its chunks were dropped); nothing changed", c.ID)}
	}
	if c.Skip {
		return Result{Err: Errorf(wire.CodeUnavailable, "restore %s: skipped on this server by the operator (--skip-restore); nothing changed", c.ID)}
	}
	if uint64(len(s.chunks)) != c.Chunks || s.size != c.Size {
		return Result{Err: Errorf(wire.CodeUnavailable, "restore %s: %d chunks of %d bytes staged, the commit names %d of %d; nothing changed",
			c.ID, len(s.chunks), s.size, c.Chunks, c.Size)}
	}
	h := sha256.New()
	for _, ch := range s.chunks {
		h.Write(ch)
	}
	if Hash(h.Sum(nil)) != c.SHA256 {
		return Result{Err: Errorf(wire.CodeInvalidArgument, "restore %s: the staged bytes do not match the commit's SHA-256; nothing changed", c.ID)}
	}
	r := &chunkReader{chunks: s.chunks}
	s.chunks = nil
	nf := New()
	if err := nf.Restore(r); err != nil {
		return Result{Err: Errorf(wire.CodeInvalidArgument, "restore %s: the state does not decode: %v; nothing changed", c.ID, err)}
	}
	nf.stage = nil // a restore the backup was receiving when it was saved is not this one's
	if nf.periodMS != 0 && f.periodMS != 0 && nf.periodMS != f.periodMS {
		return Result{Err: Errorf(wire.CodeInvalidArgument, "restore %s: its tick period is %dms; this cluster ticks every %dms; nothing changed",
			c.ID, nf.periodMS, f.periodMS)}
	}
	// What is due in either state ends first, as a tick without a limit
	// would end it: a lease left due by a limited tick is not live (it
	// would come back to life, or keep a key, with its old token), and
	// a record of the file that was due when it was saved had no time
	// left to bring back. Both states then have an empty backlog, and
	// every active lease bound to a session is bound to an active one.
	nf.expireDue(0, nf.wallMS, true)
	nf.events, nf.notices = nil, nil
	f.expireDue(0, f.wallMS, true)
	st := nf.RebaseAbove(f, f.index, c.FenceFloor)
	if err := nf.checkRestoreQuota(c.Quota); err != nil {
		// The running state stays as it is (but for what was due, which
		// ended above as the next tick would have ended it), and so do
		// its queued acquires and event streams.
		err.Message = "restore " + c.ID + ": " + err.Message + "; nothing changed"
		return Result{Err: err}
	}
	f.events = f.events[:0] // the event streams end at a restore
	notices := f.notices
	for _, k := range f.keys.sortedNames() {
		for _, w := range f.keys.Get(k).waiters() {
			notices = append(notices, Notice{LeaseID: w.Cmd.LeaseID, Err: Errorf(wire.CodeUnavailable,
				"the cluster state was restored from a snapshot while this acquire waited; it was not granted")})
		}
	}
	seq := f.seq
	f.replace(nf)
	f.seq = seq
	f.notices = notices
	return Result{Restore: &st}
}

// checkRestoreQuota refuses a restored state f (rebased) that would
// exceed q's count limits: the live leases (a restored state has no queued
// acquire), the active sessions, and one holder's active leases or
// sessions (the first such holder in name order is named). Where a limit
// holds, it holds at every applied index, a restore's too.
func (f *FSM) checkRestoreQuota(q Quota) *wire.Error {
	if n := uint64(f.active + len(f.waiting)); q.Leases > 0 && n > q.Leases {
		return Exhausted("leases", q.Leases, "the restored state would have %d live leases, above the limit of %d (--max-leases)", n, q.Leases)
	}
	if n := uint64(f.sessOpen); q.Sessions > 0 && n > q.Sessions {
		return Exhausted("sessions", q.Sessions, "the restored state would have %d active sessions, above the limit of %d (--max-sessions)", n, q.Sessions)
	}
	if q.HolderLeases == 0 && q.HolderSessions == 0 {
		return nil
	}
	var leases, sessions string // the first holder over each limit
	for h, hi := range f.holders {
		if q.HolderLeases > 0 && uint64(hi.leases.n) > q.HolderLeases && (leases == "" || h < leases) {
			leases = h
		}
		if q.HolderSessions > 0 && uint64(hi.sessions.n) > q.HolderSessions && (sessions == "" || h < sessions) {
			sessions = h
		}
	}
	switch {
	case leases != "":
		return Exhausted("leases_per_holder", q.HolderLeases, "holder %s would have %d active leases after the restore, above the limit of %d (--max-leases-per-holder)",
			quote(leases), f.holders[leases].leases.n, q.HolderLeases)
	case sessions != "":
		return Exhausted("sessions_per_holder", q.HolderSessions, "holder %s would have %d active sessions after the restore, above the limit of %d (--max-sessions-per-holder)",
			quote(sessions), f.holders[sessions].sessions.n, q.HolderSessions)
	}
	return nil
}

// PreviewRestore is what applying a restore of f, a state decoded from a
// snapshot file, with quota q and fence floor floor would decide against
// cur as it is now: it rebases f against cur (f is consumed: use it for
// nothing else) and checks q. cur is only read (hold its lock for reading
// meanwhile). It is exact when cur has no backlog (ticks without an
// expiry limit leave none); with one, the records it holds count as live
// here, which the apply ends first. The leader's check before it sends a
// restore; the apply decides.
func (f *FSM) PreviewRestore(cur *FSM, q Quota, floor uint64) (RebaseStats, *wire.Error) {
	f.stage = nil
	f.expireDue(0, f.wallMS, true)
	f.events, f.notices = nil, nil
	st := f.RebaseAbove(cur, cur.index, floor)
	return st, f.checkRestoreQuota(q)
}

// chunkReader reads staged chunks in order, letting go of each as it is
// read, so that the staged bytes and the decoded state are not both held
// whole.
type chunkReader struct{ chunks [][]byte }

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.chunks) > 0 && len(r.chunks[0]) == 0 {
		r.chunks[0] = nil
		r.chunks = r.chunks[1:]
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	return n, nil
}
