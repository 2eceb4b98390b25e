package fsm

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
)

// SnapshotFormat is the version of the snapshot encoding WriteTo produces.
// Restore also reads format 1 (JSON lines, snapshot_v1.go).
const SnapshotFormat = 2

// snapMagic starts a snapshot of format 2 or later; the format number is
// the first field of the header record after it. (A format 1 snapshot starts
// with '{'.)
const snapMagic = "LHSNAP"

// maxSnapRecord bounds the length of one record. Record bodies are read as
// they arrive, so a length larger than the input only costs what the input
// holds.
const maxSnapRecord = 1 << 30

type snapHeader struct {
	Format   int    `json:"leasehold_snapshot"`
	Index    uint64 `json:"index"`
	Tick     uint64 `json:"tick"`
	PeriodMS int64  `json:"period_ms"`
	WallMS   int64  `json:"wall_ms"`
	Fence    uint64 `json:"fence"`
	Leases   int    `json:"leases"`
	Sessions int    `json:"sessions"`
	Keys     int    `json:"keys"`
	// Members counts the member records after the leases. The header has
	// the field only when it is not zero (so a snapshot written before the
	// registry existed reads as one with none); format 1 has no members.
	Members int `json:"-"`
	// ClusterID is the cluster's identity (clusterid.go), written after
	// Members (then written even when zero) only when set; format 1 has
	// none.
	ClusterID string `json:"-"`
	// SealCheck is the sealing key's check value (sealcheck.go), written
	// after ClusterID (then written even when empty) only when set.
	SealCheck string `json:"-"`
}

// snapKey is a key's state as captured by Snapshot.
type snapKey struct {
	key   string
	limit uint32
	more  *keyMore // a copy; nil when the key has none
}

// Snapshot is a point-in-time image of the state. Taking it is cheap (it
// shares the copy-on-write records); WriteTo does the encoding and may run
// concurrently with further Apply calls.
type Snapshot struct {
	hdr      snapHeader
	leases   []*Lease
	sessions []*Session
	keys     []snapKey
	members  []MemberRecord
	stage    *restoreStage // a copy; nil when no restore is staged
}

// Snapshot captures the current state.
func (f *FSM) Snapshot() *Snapshot {
	s := &Snapshot{hdr: snapHeader{Format: SnapshotFormat, Index: f.index, Tick: f.tick,
		PeriodMS: f.periodMS, WallMS: f.wallMS, Fence: f.fence, ClusterID: f.clusterID, SealCheck: f.sealCheck}}
	s.leases = make([]*Lease, 0, f.leases.Len())
	for l := range f.leases.All() {
		s.leases = append(s.leases, l)
	}
	s.sessions = make([]*Session, 0, len(f.sessions))
	for _, x := range f.sessions {
		s.sessions = append(s.sessions, x)
	}
	s.keys = make([]snapKey, 0, f.keys.Len())
	for ks := range f.keys.All() {
		k := ks.key
		sk := snapKey{key: k, limit: ks.limit}
		if m := ks.more; m != nil {
			// Apply changes these lists in place.
			sk.more = &keyMore{blocked: slices.Clone(m.blocked), waitq: m.waitq.frozen(), stolen: slices.Clone(m.stolen)}
		}
		s.keys = append(s.keys, sk)
	}
	s.members = make([]MemberRecord, 0, len(f.members))
	for _, m := range f.members {
		s.members = append(s.members, m)
	}
	s.hdr.Leases, s.hdr.Sessions, s.hdr.Keys, s.hdr.Members = len(s.leases), len(s.sessions), len(s.keys), len(s.members)
	if st := f.stage; st != nil {
		// The chunks' bytes never change; the list grows in place.
		s.stage = &restoreStage{id: st.id, chunks: slices.Clone(st.chunks), size: st.size, last: st.last}
	}
	return s
}

// Index is the log index the snapshot reflects.
func (s *Snapshot) Index() uint64 { return s.hdr.Index }

func (s *Snapshot) sort() {
	sortByName(s.leases, func(l **Lease) string { return (*l).ID })
	sortByName(s.sessions, func(x **Session) string { return (*x).ID })
	sortByName(s.keys, func(k *snapKey) string { return k.key })
	sortMembers(s.members)
}

// sortByName sorts xs by name, which is distinct for each. Most ids share
// a long prefix (a fixed "ls_" and then counters), where string comparison
// spends its time, so it sorts by the 8 bytes after the prefix common to
// all names first and compares whole names only where those are equal.
func sortByName[T any](xs []T, name func(*T) string) {
	if len(xs) < 2 {
		return
	}
	first := name(&xs[0])
	lcp := len(first)
	for i := range xs {
		n := name(&xs[i])
		j := 0
		for j < lcp && j < len(n) && n[j] == first[j] {
			j++
		}
		lcp = j
	}
	type entry struct {
		k uint64
		i int
	}
	es := make([]entry, len(xs))
	for i := range xs {
		var k uint64
		n := name(&xs[i])[lcp:]
		for j := range 8 {
			k <<= 8
			if j < len(n) {
				k |= uint64(n[j])
			}
		}
		es[i] = entry{k, i}
	}
	// k orders names consistently: a name that ends within the 8 bytes
	// counts as padded with zero bytes, and equal k fall back to the names.
	slices.SortFunc(es, func(a, b entry) int {
		if c := cmp.Compare(a.k, b.k); c != 0 {
			return c
		}
		return strings.Compare(name(&xs[a.i]), name(&xs[b.i]))
	})
	// Permute xs in place (position j takes xs[es[j].i]), one cycle at a
	// time, marking each position done by es[j].i = j: a copy of xs would
	// cost another 32 MiB at a million keys while the snapshot is taken.
	for j := range es {
		if es[j].i == j {
			continue
		}
		x, cur := xs[j], j
		for {
			src := es[cur].i
			es[cur].i = cur
			if src == j {
				xs[cur] = x
				break
			}
			xs[cur] = xs[src]
			cur = src
		}
	}
}

// WriteTo encodes the snapshot (format 2): the magic, then length-prefixed
// records: the header, the keys, the sessions, the leases and the members,
// each group sorted, so equal states give equal bytes. Records use the binary encoding
// of the log (codec.go).
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	s.sort()
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, 1<<16)
	bw.WriteString(snapMagic)
	e := enc{b: make([]byte, 0, 1024)}
	var lenBuf [10]byte
	record := func() error {
		if e.err != nil {
			return e.err
		}
		if len(e.b) > maxSnapRecord {
			return fmt.Errorf("fsm: snapshot record of %d bytes", len(e.b))
		}
		n := putUvarint(lenBuf[:], uint64(len(e.b)))
		bw.Write(lenBuf[:n])
		_, err := bw.Write(e.b)
		e.b = e.b[:0]
		return err
	}
	s.hdr.encode(&e)
	if err := record(); err != nil {
		return cw.n, err
	}
	for i := range s.keys {
		s.keys[i].encode(&e)
		if err := record(); err != nil {
			return cw.n, err
		}
	}
	for _, x := range s.sessions {
		encodeSession(&e, x)
		if err := record(); err != nil {
			return cw.n, err
		}
	}
	for _, l := range s.leases {
		encodeLease(&e, l)
		if err := record(); err != nil {
			return cw.n, err
		}
	}
	for i := range s.members {
		encodeMember(&e, &s.members[i])
		if err := record(); err != nil {
			return cw.n, err
		}
	}
	if st := s.stage; st != nil {
		// A staged restore (restore.go) follows the members: a record
		// naming it, then one record per chunk. Only a snapshot taken
		// while a restore is received has it (a release that does not
		// know it refuses such a snapshot: trailing data).
		e.str(st.id)
		e.uvarint(st.last)
		e.uvarint(uint64(len(st.chunks)))
		e.uvarint(st.size)
		if err := record(); err != nil {
			return cw.n, err
		}
		for _, ch := range st.chunks {
			e.b = append(e.b, ch...)
			if err := record(); err != nil {
				return cw.n, err
			}
		}
	}
	err := bw.Flush()
	return cw.n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Restore replaces the whole state with the snapshot read from r (format 2,
// or format 1). On error the FSM is left unchanged.
func (f *FSM) Restore(r io.Reader) error {
	br := bufio.NewReaderSize(r, 1<<16)
	first, err := br.Peek(1)
	if err != nil {
		return fmt.Errorf("fsm: snapshot header: %w", noEOF(err))
	}
	var n *FSM
	switch first[0] {
	case '{', ' ', '\t', '\r', '\n':
		n, err = restoreJSON(br)
	default:
		n, err = restoreBinary(br)
	}
	if err != nil {
		return err
	}
	*f = *n
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
