package wire

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"time"
)

// The snapshot file: what GET /v1/cluster/snapshot sends and PUT takes,
// and what 'leasehold snapshot save' writes. It is self-describing:
//
//	LEASEHOLD-SNAPSHOT\n        the magic line
//	1\n                         the file format (SnapshotFileFormat)
//	{"index":...,...}\n         the JSON header (snapshotFileHeader), one line
//	<size bytes>                the body: the state machine's snapshot
//
// and nothing after the body. The header carries the body's size and
// SHA-256, so a truncated or corrupted file is refused before anything
// changes.

// SnapshotFileFormat is the version of the snapshot file layout that
// a node's SaveSnapshot writes and RestoreSnapshot reads. (The body has its own
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
	// State summarises the saved state; set by a node's RestoreSnapshot
	// and InspectSnapshotFile, which decode it.
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

// RestoreOptions are the parameters of a restore (PUT
// /v1/cluster/snapshot?fence_floor=N, leasehold snapshot restore
// --fence-floor N).
type RestoreOptions struct {
	// FenceFloor is a fencing token the restored state's tokens and its
	// fencing counter start above, with the file's and the cluster's own:
	// the last token (fence_high) of the cluster the file was saved from,
	// when that cluster issued tokens after the save (a disaster recovery
	// into another cluster, a rollback). 0: none.
	FenceFloor uint64
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

// EncodeSnapshotHeader returns the magic line, format line and JSON header
// line of a snapshot file described by info (Index, Term, CreatedAt,
// NodeID, Size and SHA256 are written; the rest is not part of the file).
func EncodeSnapshotHeader(info *SnapshotInfo) ([]byte, error) {
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
