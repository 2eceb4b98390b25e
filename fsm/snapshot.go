package fsm

import (
	"bufio"
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
	// Features are the cluster's recorded features (features.go),
	// written after SealCheck (then written even when empty) only when
	// not zero.
	Features Features `json:"-"`
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
	// The positions of leases, sessions and keys in name order, once
	// sorted (sort).
	leaseOrder, sessionOrder, keyOrder []int32
}

// Snapshot captures the current state.
func (f *FSM) Snapshot() *Snapshot {
	s := &Snapshot{hdr: snapHeader{Format: SnapshotFormat, Index: f.index, Tick: f.tick,
		PeriodMS: f.periodMS, WallMS: f.wallMS, Fence: f.fence, ClusterID: f.clusterID, SealCheck: f.sealCheck, Features: f.features}}
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

// sort orders the records by name: the members in place, the rest
// through their orders (nameOrder).
func (s *Snapshot) sort() {
	var sc radixScratch
	s.leaseOrder = nameOrder(s.leases, func(l **Lease) string { return (*l).ID }, &sc)
	s.sessionOrder = nameOrder(s.sessions, func(x **Session) string { return (*x).ID }, &sc)
	s.keyOrder = nameOrder(s.keys, func(k *snapKey) string { return k.key }, &sc)
	sortMembers(s.members)
}

// nameOrder returns the positions of xs in the order of their names,
// which are distinct. A snapshot orders a million names or more while the
// server runs, so it avoids comparing strings, and touches each record
// once:
//   - one pass reads each name and takes the 8 bytes after the prefix
//     common to all names (most ids share a long one: "ls_", "camera/") as
//     a number; the prefix is guessed from a few names and checked in the
//     same pass (a second pass redoes the numbers if the guess was long);
//   - a radix sort orders the numbers, and names whose numbers are equal
//     are then compared whole.
//
// The caller reads xs through the order rather than permuting xs: a
// permutation walks its cycles one dependent memory access after another,
// which cost more than the sort itself at a million names.
//
// sc is the sort's scratch, kept for the next call.
func nameOrder[T any](xs []T, name func(*T) string, sc *radixScratch) []int32 {
	if len(xs) == 0 {
		return nil
	}
	first := name(&xs[0])
	guess := len(first)
	for i := 1; i < min(len(xs), 16); i++ {
		guess = commonPrefix(first, name(&xs[i]), guess)
	}
	// The numbers and the positions are two slices (12 bytes a name, and
	// as much scratch for the sort): the positions become the order.
	ks, order := make([]uint64, len(xs)), make([]int32, len(xs))
	lcp := guess
	for i := range xs {
		n := name(&xs[i])
		lcp = commonPrefix(first, n, lcp)
		ks[i], order[i] = key8(n, guess), int32(i)
	}
	if lcp < guess {
		for i := range ks {
			ks[i] = key8(name(&xs[i]), lcp)
		}
	}
	radixSort(ks, order, sc)
	for a := 0; a < len(ks); {
		b := a + 1
		for b < len(ks) && ks[b] == ks[a] {
			b++
		}
		if b-a > 1 {
			slices.SortFunc(order[a:b], func(x, y int32) int {
				return strings.Compare(name(&xs[x]), name(&xs[y]))
			})
		}
		a = b
	}
	return order
}

// commonPrefix is the length of the prefix a and b share, at most limit.
func commonPrefix(a, b string, limit int) int {
	j := 0
	for j < limit && j < len(a) && j < len(b) && a[j] == b[j] {
		j++
	}
	return j
}

// key8 is the 8 bytes of n after off, big-endian, a name that ends sooner
// padded with zero bytes. For names that share their first off bytes, a
// smaller key8 means a smaller name, and equal ones must be compared whole.
// (A name shorter than off gets 0: it does not share the prefix, and
// nameOrder redoes every key8 with a shorter one.)
func key8(n string, off int) uint64 {
	var k uint64
	n = n[min(off, len(n)):]
	for j := range 8 {
		k <<= 8
		if j < len(n) {
			k |= uint64(n[j])
		}
	}
	return k
}

// radixScratch is radixSort's scratch, grown as needed: a snapshot sorts
// its leases, sessions and keys with one.
type radixScratch struct {
	ks    []uint64
	order []int32
}

// radixSort orders ks, and order with it, by ks (least significant byte
// first, skipping the bytes all keys share), through sc.
func radixSort(ks []uint64, order []int32, sc *radixScratch) {
	if len(sc.ks) < len(ks) {
		sc.ks, sc.order = make([]uint64, len(ks)), make([]int32, len(ks))
	}
	tk, to := sc.ks[:len(ks)], sc.order[:len(ks)]
	srcK, srcO, dstK, dstO := ks, order, tk, to
	for shift := uint(0); shift < 64; shift += 8 {
		var count [256]int
		for _, k := range srcK {
			count[byte(k>>shift)]++
		}
		if count[byte(srcK[0]>>shift)] == len(srcK) {
			continue
		}
		pos := 0
		for d := range count {
			c := count[d]
			count[d] = pos
			pos += c
		}
		for i, k := range srcK {
			d := byte(k >> shift)
			dstK[count[d]], dstO[count[d]] = k, srcO[i]
			count[d]++
		}
		srcK, srcO, dstK, dstO = dstK, dstO, srcK, srcO
	}
	if &srcK[0] != &ks[0] {
		copy(ks, srcK)
		copy(order, srcO)
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
	// The records share nothing Apply changes (Snapshot), so writeRecords
	// may encode them on goroutines of its own.
	if err := writeRecords(bw, len(s.keyOrder), s.warmKeys, func(e *enc, j int) { s.keys[s.keyOrder[j]].encode(e) }); err != nil {
		return cw.n, err
	}
	if err := writeRecords(bw, len(s.sessionOrder), nil, func(e *enc, j int) { sessionFields(fields{e: e}, s.sessions[s.sessionOrder[j]], nil) }); err != nil {
		return cw.n, err
	}
	if err := writeRecords(bw, len(s.leaseOrder), s.warmLeases, func(e *enc, j int) { encodeLease(e, s.leases[s.leaseOrder[j]]) }); err != nil {
		return cw.n, err
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

// warmLeases reads, for the leases lo..hi-1 in name order, what
// encodeLease reads first of each: the lease's lines and its id and key
// (writeRecords' warm).
func (s *Snapshot) warmLeases(lo, hi int) byte {
	var x byte
	for _, i := range s.leaseOrder[lo:hi] {
		l := s.leases[i]
		x ^= byte(len(l.ID)) ^ l.TokenHash[0] ^ byte(l.RenewedWallMS)
		if len(l.ID) > 0 {
			x ^= l.ID[0]
		}
		if len(l.Key) > 0 {
			x ^= l.Key[0]
		}
	}
	return x
}

// warmKeys is warmLeases for the keys.
func (s *Snapshot) warmKeys(lo, hi int) byte {
	var x byte
	for _, i := range s.keyOrder[lo:hi] {
		if k := s.keys[i].key; len(k) > 0 {
			x ^= k[0]
		}
	}
	return x
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
	f.replace(n)
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
