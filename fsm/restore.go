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
}

// Type implements Command.
func (*RestoreChunk) Type() Type { return TypeRestoreChunk }

// Type implements Command.
func (*RestoreCommit) Type() Type { return TypeRestoreCommit }

func validRestoreID(id string) *wire.Error {
	return validPrintable("restore id", id, MaxRestoreIDBytes)
}

func (c *RestoreChunk) encode(e *enc) {
	e.str(c.ID)
	e.uvarint(c.Seq)
	e.bytes(c.Data)
	e.uvarint(uint64(c.CRC))
}

// decode keeps Data as a view of the entry (no copy): the entry's bytes
// are never changed once in the log, and a restore's chunks are large.
func (c *RestoreChunk) decode(d *dec) {
	c.ID = d.str()
	c.Seq = d.uvarint()
	c.Data = d.take(d.count(1))
	c.CRC = d.uint32()
	if d.err != nil {
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

func (c *RestoreCommit) encode(e *enc) {
	e.str(c.ID)
	e.uvarint(c.Chunks)
	e.uvarint(c.Size)
	e.hash(c.SHA256)
}

func (c *RestoreCommit) decode(d *dec) {
	c.ID = d.str()
	c.Chunks = d.uvarint()
	c.Size = d.uvarint()
	c.SHA256 = d.hash()
	if d.err == nil && validRestoreID(c.ID) != nil {
		d.fail("restore commit: bad restore id")
	}
}

// restoreStage is a restore's chunks received so far.
type restoreStage struct {
	id     string
	chunks [][]byte
	size   uint64
	last   uint64 // the tick of the last chunk
}

// Staged describes the restore staged, if any: its id, its chunks and
// bytes so far.
func (f *FSM) Staged() (id string, chunks int, size uint64) {
	if f.stage == nil {
		return "", 0, 0
	}
	return f.stage.id, len(f.stage.chunks), f.stage.size
}

func (f *FSM) restoreChunk(c *RestoreChunk) Result {
	if err := validRestoreID(c.ID); err != nil {
		return Result{Err: err}
	}
	s := f.stage
	if c.Seq == 0 {
		s = &restoreStage{id: c.ID}
		f.stage = s
	} else if s == nil || s.id != c.ID || c.Seq != uint64(len(s.chunks)) {
		if s != nil && s.id == c.ID {
			f.stage = nil // a gap: this restore can no longer commit
		}
		return Result{Err: Errorf(wire.CodeUnavailable, "restore %s: chunk %d is not the next one of a staged restore", c.ID, c.Seq)}
	}
	if s.size+uint64(len(c.Data)) > MaxRestoreBytes {
		f.stage = nil
		return Result{Err: Errorf(wire.CodePayloadTooLarge, "restore %s: more than %d bytes", c.ID, uint64(MaxRestoreBytes))}
	}
	s.chunks = append(s.chunks, c.Data)
	s.size += uint64(len(c.Data))
	s.last = f.tick
	return Result{}
}

// dropStaleStage drops a staged restore that has had no chunk for
// RestoreStaleMS (a tick applies it).
func (f *FSM) dropStaleStage() {
	if f.stage == nil {
		return
	}
	period := f.periodMS
	if period <= 0 {
		period = 100
	}
	if f.tick-f.stage.last > uint64(RestoreStaleMS/period) {
		f.stage = nil
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
	f.events = f.events[:0] // the event streams end at a restore
	notices := f.notices
	for _, k := range f.keys.sortedNames() {
		for _, w := range f.keys.Get(k).waiters() {
			notices = append(notices, Notice{LeaseID: w.Cmd.LeaseID, Err: Errorf(wire.CodeUnavailable,
				"the cluster state was restored from a snapshot while this acquire waited; it was not granted")})
		}
	}
	st := nf.RebaseStats(f, f.index)
	seq := f.seq
	*f = *nf
	f.seq = seq
	f.notices = notices
	return Result{Restore: &st}
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
