package fsm

import (
	"bufio"
	"cmp"
	"container/heap"
	"errors"
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
}

// Snapshot captures the current state.
func (f *FSM) Snapshot() *Snapshot {
	s := &Snapshot{hdr: snapHeader{Format: SnapshotFormat, Index: f.index, Tick: f.tick,
		PeriodMS: f.periodMS, WallMS: f.wallMS, Fence: f.fence, ClusterID: f.clusterID, SealCheck: f.sealCheck}}
	s.leases = make([]*Lease, 0, len(f.leases))
	for _, l := range f.leases {
		s.leases = append(s.leases, l)
	}
	s.sessions = make([]*Session, 0, len(f.sessions))
	for _, x := range f.sessions {
		s.sessions = append(s.sessions, x)
	}
	s.keys = make([]snapKey, 0, len(f.keys))
	for k, ks := range f.keys {
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
	out := make([]T, len(xs))
	for j, e := range es {
		out[j] = xs[e.i]
	}
	copy(xs, out)
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

// recordReader reads the length-prefixed records of a format 2 snapshot.
type recordReader struct {
	r   *bufio.Reader
	buf []byte
}

// next returns the body of the next record, valid until the next call.
func (rr *recordReader) next() ([]byte, error) {
	size, err := readUvarint(rr.r)
	if err != nil {
		return nil, err
	}
	if size > maxSnapRecord {
		return nil, fmt.Errorf("record of %d bytes", size)
	}
	n := int(size)
	if n <= rr.r.Size() {
		// The common case: the record fits in the reader's buffer.
		p, err := rr.r.Peek(n)
		if err != nil {
			return nil, noEOF(err)
		}
		rr.buf = append(rr.buf[:0], p...)
		rr.r.Discard(n)
		return rr.buf, nil
	}
	// A long record is read in pieces, so that a length the input does not
	// back costs no more than the input.
	rr.buf = rr.buf[:0]
	for len(rr.buf) < n {
		chunk := min(n-len(rr.buf), max(len(rr.buf), 1<<16))
		rr.buf = slices.Grow(rr.buf, chunk)
		m, err := io.ReadFull(rr.r, rr.buf[len(rr.buf):len(rr.buf)+chunk])
		rr.buf = rr.buf[:len(rr.buf)+m]
		if err != nil {
			return nil, noEOF(err)
		}
	}
	return rr.buf, nil
}

// readUvarint reads a uvarint in its shortest form.
func readUvarint(r io.ByteReader) (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return 0, noEOF(err)
		}
		if i == 9 && b > 1 {
			return 0, errors.New("varint overflows 64 bits")
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			if i > 0 && b == 0 {
				return 0, errors.New("varint not in its shortest form")
			}
			return v, nil
		}
	}
	return 0, errors.New("varint overflows 64 bits")
}

func putUvarint(p []byte, v uint64) int {
	i := 0
	for v >= 0x80 {
		p[i] = byte(v) | 0x80
		v >>= 7
		i++
	}
	p[i] = byte(v)
	return i + 1
}

// decodeRecord decodes one record body with fn, which must consume all of it.
func decodeRecord(body []byte, what string, i int, fn func(*dec)) error {
	d := dec{b: body, size: len(body)}
	fn(&d)
	if d.err == nil && len(d.b) > 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return fmt.Errorf("fsm: snapshot %s %d: %w", what, i, d.err)
	}
	return nil
}

// keyRec is a key's state as read from a snapshot.
type keyRec struct {
	key     string
	ks      *keyState
	waiters []waiter // queued by rebuild
}

// restoreBinary reads a format 2 snapshot into a new state machine. Each
// group of records is collected in a slice that grows with what was actually
// read (the counts of the header only say when to stop), and its map is
// made at its final size once the group is complete.
func restoreBinary(br *bufio.Reader) (*FSM, error) {
	magic := make([]byte, len(snapMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != snapMagic {
		return nil, errors.New("fsm: not a snapshot (bad magic)")
	}
	rr := &recordReader{r: br}
	body, err := rr.next()
	if err != nil {
		return nil, fmt.Errorf("fsm: snapshot header: %w", err)
	}
	var hdr snapHeader
	if err := decodeRecord(body, "header", 0, hdr.decode); err != nil {
		return nil, err
	}
	n := New()
	var keys []keyRec
	for i := 0; i < hdr.Keys; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot key %d: %w", i, err)
		}
		var k keyRec
		if err := decodeRecord(body, "key", i, func(d *dec) { decodeKey(d, &k) }); err != nil {
			return nil, err
		}
		if i > 0 && k.key <= keys[i-1].key {
			return nil, fmt.Errorf("fsm: snapshot key %d: keys not in strictly increasing order", i)
		}
		keys = append(keys, k)
	}
	n.keys = make(map[string]*keyState, len(keys))
	for _, k := range keys {
		n.keys[k.key] = k.ks
	}
	var sessions []*Session
	for i := 0; i < hdr.Sessions; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot session %d: %w", i, err)
		}
		x := new(Session)
		if err := decodeRecord(body, "session", i, func(d *dec) { n.decodeSession(d, x) }); err != nil {
			return nil, err
		}
		if i > 0 && x.ID <= sessions[i-1].ID || x.ID == "" {
			return nil, fmt.Errorf("fsm: snapshot session %d: ids not in strictly increasing order", i)
		}
		sessions = append(sessions, x)
	}
	n.sessions = make(map[string]*Session, len(sessions))
	for _, x := range sessions {
		n.sessions[x.ID] = x
	}
	var leases []*Lease
	for i := 0; i < hdr.Leases; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot lease %d: %w", i, err)
		}
		l := new(Lease)
		if err := decodeRecord(body, "lease", i, func(d *dec) { n.decodeLease(d, l) }); err != nil {
			return nil, err
		}
		if i > 0 && l.ID <= leases[i-1].ID || l.ID == "" {
			return nil, fmt.Errorf("fsm: snapshot lease %d: ids not in strictly increasing order", i)
		}
		leases = append(leases, l)
	}
	var members []MemberRecord
	for i := 0; i < hdr.Members; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot member %d: %w", i, err)
		}
		var m MemberRecord
		if err := decodeRecord(body, "member", i, func(d *dec) { decodeMember(d, &m) }); err != nil {
			return nil, err
		}
		if i > 0 && m.ID <= members[i-1].ID || m.ID == "" {
			return nil, fmt.Errorf("fsm: snapshot member %d: ids not in strictly increasing order", i)
		}
		members = append(members, m)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, errors.New("fsm: trailing data in snapshot")
	}
	n.setHeader(hdr)
	if err := n.rebuild(keys, sessions, leases); err != nil {
		return nil, err
	}
	n.members = make(map[string]MemberRecord, len(members))
	for _, m := range members {
		n.members[m.ID] = m
	}
	return n, nil
}

func (n *FSM) setHeader(hdr snapHeader) {
	n.index, n.tick, n.periodMS, n.wallMS, n.fence = hdr.Index, hdr.Tick, hdr.PeriodMS, hdr.WallMS, hdr.Fence
	n.clusterID, n.sealCheck = hdr.ClusterID, hdr.SealCheck
}

// rebuild derives every index from the records of a snapshot, each group
// sorted by key or id without duplicates. The keys and sessions are already
// in their maps.
func (n *FSM) rebuild(keys []keyRec, sessions []*Session, leases []*Lease) error {
	seen := make(map[string]bool)
	for i, k := range keys {
		for _, w := range k.waiters {
			if w.Cmd == nil {
				return fmt.Errorf("fsm: snapshot key %d: waiter without a command", i)
			}
			if seen[w.Cmd.LeaseID] {
				return fmt.Errorf("fsm: snapshot key %d: lease id %s queued twice", i, w.Cmd.LeaseID)
			}
			seen[w.Cmd.LeaseID] = true
		}
	}
	var ended []pruneItem
	var keyless []string // keys of records whose key has no state
	n.leases = make(map[string]*Lease, len(leases))
	for _, l := range leases {
		n.leases[l.ID] = l
		if h := l.idemHash(); !h.IsZero() {
			// An active lease keeps its idempotency hash over an ended
			// one (they share one only after a restore: Rebase).
			if prev := n.leases[n.idem[h]]; prev == nil || prev.Terminal() || !l.Terminal() {
				n.idem[h] = l.ID
			}
		}
		ks := n.keys[l.Key]
		if ks != nil {
			ks.refs++
		}
		if l.Terminal() {
			ended = append(ended, pruneItem{tick: l.EndedTick, kind: kindLease, id: l.ID})
			if ks == nil {
				keyless = append(keyless, l.Key)
			}
			continue
		}
		if ks == nil {
			return fmt.Errorf("fsm: snapshot: active lease %s on key without state", l.ID)
		}
		ks.addActive(l.ID)
		n.active++
		n.holder(l.Holder).leases.insert(l.ID)
		if l.SessionID == "" {
			n.schedule(leaseDeadline(l), kindLease, l.ID)
		} else if s := n.sessions[l.SessionID]; s == nil || s.State != SessionActive {
			// Its session ended with more leases than one chunk could
			// end: its end is in the backlog (expire.go).
			n.backlog = append(n.backlog, timer{kind: kindLease, id: l.ID})
		}
	}
	n.order.fromSorted(len(leases), func(i int) string { return leases[i].ID })
	n.keyIdx.fromSorted(countKeys(keys, keyless))
	for _, s := range sessions {
		if s.State != SessionActive {
			ended = append(ended, pruneItem{tick: s.EndedTick, kind: kindSession, id: s.ID})
			continue
		}
		n.sessOpen++
		n.holder(s.Holder).sessions.insert(s.ID)
		n.schedule(s.ExpiresTick+GraceTicks, kindSession, s.ID)
	}
	n.sessIDs.fromSorted(len(sessions), func(i int) string { return sessions[i].ID })
	for h, hi := range n.holders {
		if hi.leases.n == 0 && hi.sessions.n == 0 {
			delete(n.holders, h) // interned for a record that has ended
		}
	}
	for _, k := range keys {
		ks := k.ks
		if a := ks.active(); len(a) > 1 {
			// Grant order; ids break ties (only a damaged snapshot has them).
			slices.SortStableFunc(a, func(a, b string) int {
				return cmp.Compare(n.leases[a].Fence, n.leases[b].Fence)
			})
		}
		for _, w := range k.waiters {
			if w.Cmd.Holder == "" && w.Cmd.SessionID != "" {
				// Queued before waiters named their holder (lease.go).
				if s := n.sessions[w.Cmd.SessionID]; s != nil {
					w.Cmd.Holder = s.Holder
				}
			}
			n.queueWaiter(ks, w)
			n.schedule(w.Deadline, kindWait, k.key+"\x00"+w.Cmd.LeaseID)
			if !w.Cmd.IdemHash.IsZero() {
				n.idem[w.Cmd.IdemHash] = w.Cmd.LeaseID
			}
		}
		for _, b := range ks.blocked() {
			n.schedule(b.Until, kindDelay, k.key)
		}
	}
	slices.SortFunc(ended, func(a, b pruneItem) int {
		return cmp.Or(cmp.Compare(a.tick, b.tick), cmp.Compare(a.kind, b.kind), strings.Compare(a.id, b.id))
	})
	n.prune = ended
	// Whatever a limited tick left due (schedule puts it in the backlog)
	// is processed in the order the replica that applied the tick has it.
	heap.Init((*timerHeap)(&n.backlog))
	return nil
}

// countKeys returns the keys of lease records, sorted, each with its count
// of records: the keys (sorted) whose state rebuild counted in refs (which
// it resets), merged with keyless, the keys of records without key state.
func countKeys(keys []keyRec, keyless []string) []keyRef {
	slices.Sort(keyless)
	var extra []keyRef
	for i, k := range keyless {
		if i > 0 && k == keyless[i-1] {
			extra[len(extra)-1].n++
			continue
		}
		extra = append(extra, keyRef{k, 1})
	}
	refs := make([]keyRef, 0, len(keys)+len(extra))
	j := 0
	for _, k := range keys {
		if k.ks.refs == 0 {
			continue
		}
		for j < len(extra) && extra[j].key < k.key {
			refs = append(refs, extra[j])
			j++
		}
		refs = append(refs, keyRef{k.key, k.ks.refs})
		k.ks.refs = 0
	}
	return append(refs, extra[j:]...)
}

// internHolder returns the holder named b, its string shared with every
// record of the holder. The holder is entered in the holder index (rebuild
// removes it again if nothing active refers to it).
func (n *FSM) internHolder(b []byte) *holderIndex {
	if hi := n.holders[string(b)]; hi != nil {
		return hi
	}
	return n.holder(string(b))
}

// knownReasons are the end reasons the state machine sets itself; a decoded
// reason equal to one shares its string.
var knownReasons = [...]string{ReasonExpired, ReasonSessionEnded, ReasonHolderReleased, ReasonRevoked, ReasonReleased, "ended"}

func internReason(b []byte) string {
	for _, r := range knownReasons {
		if string(b) == r {
			return r
		}
	}
	return string(b)
}

// Record codecs of format 2, in the style of the log's (codec.go): fields in
// a fixed order, nothing optional, exactly one encoding. A lease or session
// state is one byte (its index in leaseStates or sessionStates).

var (
	leaseStates   = []State{StateActive, StateReleased, StateExpired, StateRevoked}
	sessionStates = []State{SessionActive, SessionEnded, SessionExpired}
)

func (e *enc) state(s State, states []State) {
	i := slices.Index(states, s)
	if i < 0 {
		e.fail(fmt.Errorf("fsm: cannot encode state %q", s))
		return
	}
	e.b = append(e.b, byte(i))
}

func (d *dec) state(states []State) State {
	p := d.take(1)
	switch {
	case p == nil:
		return ""
	case int(p[0]) >= len(states):
		d.fail(fmt.Sprintf("unknown state %d", p[0]))
		return ""
	}
	return states[p[0]]
}

func (h *snapHeader) encode(e *enc) {
	e.uvarint(SnapshotFormat)
	e.uvarint(h.Index)
	e.uvarint(h.Tick)
	e.varint(h.PeriodMS)
	e.varint(h.WallMS)
	e.uvarint(h.Fence)
	e.uvarint(uint64(h.Keys))
	e.uvarint(uint64(h.Sessions))
	e.uvarint(uint64(h.Leases))
	if h.Members > 0 || h.ClusterID != "" || h.SealCheck != "" {
		e.uvarint(uint64(h.Members))
	}
	if h.ClusterID != "" || h.SealCheck != "" {
		e.str(h.ClusterID)
	}
	if h.SealCheck != "" {
		e.bytes([]byte(h.SealCheck))
	}
}

func (h *snapHeader) decode(d *dec) {
	if f := d.uvarint(); f != SnapshotFormat && d.err == nil {
		d.fail(fmt.Sprintf("unknown snapshot format %d", f))
	}
	h.Format = SnapshotFormat
	h.Index = d.uvarint()
	h.Tick = d.uvarint()
	h.PeriodMS = d.varint()
	h.WallMS = d.varint()
	h.Fence = d.uvarint()
	h.Keys = d.records()
	h.Sessions = d.records()
	h.Leases = d.records()
	if len(d.b) > 0 {
		// Written only when not zero, so that there is one encoding.
		if h.Members = d.records(); h.Members == 0 && len(d.b) == 0 && d.err == nil {
			d.fail("member count 0 written")
		}
	}
	if len(d.b) > 0 && d.err == nil {
		// Written only when set, so that there is one encoding.
		// An empty id is written only before a seal check.
		h.ClusterID = d.str()
		if err := ValidClusterID(h.ClusterID); err != nil && d.err == nil && (h.ClusterID != "" || len(d.b) == 0) {
			d.fail("bad cluster id: " + err.Message)
		}
	}
	if len(d.b) > 0 && d.err == nil {
		h.SealCheck = string(d.bytes())
		if n := len(h.SealCheck); (n == 0 || n > MaxSealCheckBytes) && d.err == nil {
			d.fail(fmt.Sprintf("seal check of %d bytes", n))
		}
	}
}

// records reads a count of records (not checked against the input: records
// are read one by one).
func (d *dec) records() int {
	v := d.uvarint()
	if v > 1<<62 {
		d.fail("count out of range")
		return 0
	}
	return int(v)
}

// waiterBytes is the least an encoded waiter takes: a deadline and an
// Acquire of empty strings and zero numbers (14 one-byte fields, 4 hashes).
const waiterBytes = 14 + 4*len(Hash{})

func (k *snapKey) encode(e *enc) {
	var m keyMore
	if k.more != nil {
		m = *k.more
	}
	e.str(k.key)
	e.uvarint(uint64(k.limit))
	e.uvarint(uint64(len(m.blocked)))
	for _, b := range m.blocked {
		e.uvarint(b.Until)
		e.str(b.LeaseID)
	}
	ws := m.waitq.list()
	e.uvarint(uint64(len(ws)))
	for _, w := range ws {
		if w.Cmd == nil {
			e.fail(errors.New("fsm: waiter without a command"))
			return
		}
		e.uvarint(w.Deadline)
		w.Cmd.encode(e)
	}
	e.uvarint(uint64(len(m.stolen)))
	for _, id := range m.stolen {
		e.str(id)
	}
}

func decodeKey(d *dec, k *keyRec) {
	k.key = d.str()
	var m keyMore
	limit := d.uint32()
	if n := d.count(2); n > 0 {
		m.blocked = make([]blocked, n)
		for i := range m.blocked {
			m.blocked[i].Until = d.uvarint()
			m.blocked[i].LeaseID = d.str()
		}
	}
	if n := d.count(waiterBytes); n > 0 {
		ws := make([]waiter, n)
		for i := range ws {
			ws[i].Deadline = d.uvarint()
			c := new(Acquire)
			c.decode(d)
			ws[i].Cmd = c
		}
		k.waiters = ws
	}
	if n := d.count(1); n > 0 {
		m.stolen = make([]string, n)
		for i := range m.stolen {
			m.stolen[i] = d.str()
		}
	}
	k.ks = newKeyState(limit, m)
}

// newKeyState returns the state of a key read from a snapshot. Most keys
// have nothing but a limit: their state has no keyMore (allocating one only
// for tidy to drop it cost 128 bytes of garbage a key).
func newKeyState(limit uint32, m keyMore) *keyState {
	ks := &keyState{limit: limit}
	if len(m.active) > 0 || len(m.blocked) > 0 || m.waitq.len() > 0 || len(m.stolen) > 0 {
		ks.more = new(keyMore)
		*ks.more = m
	}
	return ks
}

func encodeSession(e *enc, s *Session) {
	e.str(s.ID)
	e.str(s.Holder)
	e.state(s.State, sessionStates)
	e.hash(s.TokenHash)
	e.varint(s.TTLMS)
	e.uvarint(s.TTLTicks)
	e.uvarint(s.ExpiresTick)
	e.varint(s.CreatedWallMS)
	e.varint(s.LastHeartbeat)
	e.uvarint(s.HeartbeatCount)
	e.strmap(s.Metadata)
	e.uvarint(uint64(len(s.LeaseIDs)))
	for _, id := range s.LeaseIDs {
		e.str(id)
	}
	e.uvarint(s.EndedTick)
	e.varint(s.EndedWallMS)
	e.str(s.EndReason)
}

func (n *FSM) decodeSession(d *dec, s *Session) {
	s.ID = d.str()
	s.Holder = n.internHolder(d.strBytes()).name
	s.State = d.state(sessionStates)
	s.TokenHash = d.hash()
	s.TTLMS = d.varint()
	s.TTLTicks = d.uvarint()
	s.ExpiresTick = d.uvarint()
	s.CreatedWallMS = d.varint()
	s.LastHeartbeat = d.varint()
	s.HeartbeatCount = d.uvarint()
	s.Metadata = d.strmap()
	if n := d.count(1); n > 0 {
		s.LeaseIDs = make([]string, n)
		for i := range s.LeaseIDs {
			s.LeaseIDs[i] = d.str()
		}
	}
	s.EndedTick = d.uvarint()
	s.EndedWallMS = d.varint()
	s.EndReason = internReason(d.strBytes())
}

// encodeLease writes a lease. The idempotency hashes, zero for most leases,
// follow a bool saying whether either is set (it is 1 only if one is).
func encodeLease(e *enc, l *Lease) {
	e.str(l.ID)
	e.str(l.Key)
	e.str(l.Holder)
	e.uvarint(uint64(l.Limit))
	e.str(l.SessionID)
	e.state(l.State, leaseStates)
	e.uvarint(l.Fence)
	e.hash(l.TokenHash)
	e.varint(l.TTLMS)
	e.uvarint(l.TTLTicks)
	e.uvarint(l.ExpiresTick)
	e.uvarint(l.AcquiredTick)
	e.varint(l.AcquiredWallMS)
	e.varint(l.RenewedWallMS)
	e.uvarint(l.EndedTick)
	e.varint(l.EndedWallMS)
	e.uvarint(uint64(l.RenewalCount))
	e.strmap(l.Metadata)
	e.str(l.EndReason)
	e.uvarint(l.LockDelayTicks)
	e.bool(l.hasIdemHashes())
	if l.hasIdemHashes() {
		e.hash(l.idem.hash)
		e.hash(l.idem.fingerprint)
	}
	e.bytes(l.SealedToken())
}

// decodeLease reads a lease. Its id and key share one allocation; its
// holder, session id and end reason share the strings of other records.
func (n *FSM) decodeLease(d *dec, l *Lease) {
	id, key := d.strBytes(), d.strBytes()
	var arr [96]byte
	idKey := string(append(append(arr[:0], id...), key...))
	l.ID, l.Key = idKey[:len(id)], idKey[len(id):]
	l.Holder = n.internHolder(d.strBytes()).name
	l.Limit = d.uint32()
	if sid := d.strBytes(); len(sid) > 0 {
		if s := n.sessions[string(sid)]; s != nil {
			l.SessionID = s.ID
		} else {
			l.SessionID = string(sid)
		}
	}
	l.State = d.state(leaseStates)
	l.Fence = d.uvarint()
	l.TokenHash = d.hash()
	l.TTLMS = d.varint()
	l.TTLTicks = d.uvarint()
	l.ExpiresTick = d.uvarint()
	l.AcquiredTick = d.uvarint()
	l.AcquiredWallMS = d.varint()
	l.RenewedWallMS = d.varint()
	l.EndedTick = d.uvarint()
	l.EndedWallMS = d.varint()
	l.RenewalCount = d.uint32()
	l.Metadata = d.strmap()
	l.EndReason = internReason(d.strBytes())
	l.LockDelayTicks = d.uvarint()
	var h, fp Hash
	if d.bool() {
		if h, fp = d.hash(), d.hash(); h.IsZero() && fp.IsZero() && d.err == nil {
			d.fail("idempotency hashes flagged but zero")
		}
	}
	l.idem = newLeaseIdem(h, fp, d.bytes())
}
