package fsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

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
	keys, err := readKeys(rr, hdr.Keys)
	if err != nil {
		return nil, err
	}
	n.keys.reserve(len(keys))
	for _, k := range keys {
		n.keys.Put(k.ks)
	}
	sessions, err := rebuilder{n}.readSessions(rr, hdr.Sessions)
	if err != nil {
		return nil, err
	}
	n.sessions = make(map[string]*Session, len(sessions))
	for _, x := range sessions {
		n.sessions[x.ID] = x
	}
	if err := checkWaiters(keys); err != nil {
		return nil, err
	}
	rebuilder{n}.setHeader(hdr)
	leases, ended, keyless, err := rebuilder{n}.readAndRebuildLeases(rr, hdr.Leases)
	if err != nil {
		return nil, err
	}
	members, err := readMembers(rr, hdr.Members)
	if err != nil {
		return nil, err
	}
	stage, err := readStage(rr)
	if err != nil {
		return nil, err
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, errors.New("fsm: trailing data in snapshot")
	}
	n.stage = stage
	if err := (rebuilder{n}).rebuildRest(keys, sessions, leases, ended, keyless); err != nil {
		return nil, err
	}
	n.members = make(map[string]MemberRecord, len(members))
	for _, m := range members {
		n.members[m.ID] = m
	}
	return n, nil
}

// preallocMax bounds the room a snapshot's header count makes for its
// records before they are read (a slice grows past it as records arrive),
// so that a damaged header cannot make a restore allocate without bound.
const preallocMax = 1 << 20

// readKeys reads count key records, strictly increasing by key.
func readKeys(rr *recordReader, count int) ([]keyRec, error) {
	keys := make([]keyRec, 0, min(count, preallocMax))
	for i := 0; i < count; i++ {
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
	return keys, nil
}

// readSessions reads count session records, strictly increasing by id.
func (n rebuilder) readSessions(rr *recordReader, count int) ([]*Session, error) {
	var sessions []*Session
	for i := 0; i < count; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot session %d: %w", i, err)
		}
		x := new(Session)
		if err := decodeRecord(body, "session", i, func(d *dec) { sessionFields(fields{d: d}, x, n.holderName) }); err != nil {
			return nil, err
		}
		if i > 0 && x.ID <= sessions[i-1].ID || x.ID == "" {
			return nil, fmt.Errorf("fsm: snapshot session %d: ids not in strictly increasing order", i)
		}
		sessions = append(sessions, x)
	}
	return sessions, nil
}

// leaseBatch is how many leases readAndRebuildLeases hands over at a time.
const leaseBatch = 4096

// readAndRebuildLeases reads count lease records, strictly increasing by
// id, and enters them in the state (rebuildLeases) as they are read: a
// goroutine decodes while this one rebuilds, so that a restore, which
// otherwise keeps one processor busy for seconds at a million leases,
// uses two. The decoder only reads the state (the key states and sessions
// restored before the leases) and interns holder names in a map of its
// own. It returns the leases in order, with what rebuildLeases returns.
func (n rebuilder) readAndRebuildLeases(rr *recordReader, count int) (leases []*Lease, ended []pruneItem, keyless []string, err error) {
	type batch struct {
		leases []*Lease
		kss    []*keyState
	}
	batches := make(chan batch, 4)
	stop := make(chan struct{})
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
		}
	}
	defer halt() // also if the rebuild panics: the decoder must not wait forever
	var derr error
	ld := newLeaseDecoder(n.FSM)
	go func() {
		defer close(batches)
		var b batch
		send := func() bool {
			select {
			case batches <- b:
				b = batch{}
				return true
			case <-stop:
				return false
			}
		}
		var prev string
		for i := 0; i < count; i++ {
			body, err := rr.next()
			if err != nil {
				derr = fmt.Errorf("fsm: snapshot lease %d: %w", i, err)
				return
			}
			l := new(Lease)
			var ks *keyState
			if err := decodeRecord(body, "lease", i, func(d *dec) { ks = ld.decodeLease(d, l) }); err != nil {
				derr = err
				return
			}
			if i > 0 && l.ID <= prev || l.ID == "" {
				derr = fmt.Errorf("fsm: snapshot lease %d: ids not in strictly increasing order", i)
				return
			}
			prev = l.ID
			if b.leases == nil {
				b = batch{make([]*Lease, 0, leaseBatch), make([]*keyState, 0, leaseBatch)}
			}
			b.leases, b.kss = append(b.leases, l), append(b.kss, ks)
			if len(b.leases) == leaseBatch && !send() {
				return
			}
		}
		if len(b.leases) > 0 {
			send()
		}
	}()
	n.leases.reserve(min(count, preallocMax))
	leases = make([]*Lease, 0, min(count, preallocMax))
	for b := range batches {
		if err != nil {
			continue // draining what was sent before stop
		}
		if ended, keyless, err = n.rebuildLeases(b.leases, b.kss, ended, keyless); err != nil {
			halt()
			continue
		}
		leases = append(leases, b.leases...)
	}
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, nil, nil, err
	}
	return leases, ended, keyless, nil
}

// readMembers reads count member records, strictly increasing by id.
func readMembers(rr *recordReader, count int) ([]MemberRecord, error) {
	var members []MemberRecord
	for i := 0; i < count; i++ {
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
	return members, nil
}

// readStage reads the staged restore after the members, if the snapshot
// has one.
func readStage(rr *recordReader) (*restoreStage, error) {
	if _, err := rr.r.Peek(1); err == io.EOF {
		return nil, nil
	}
	body, err := rr.next()
	if err != nil {
		return nil, fmt.Errorf("fsm: snapshot restore stage: %w", err)
	}
	st := &restoreStage{}
	var count int
	if err := decodeRecord(body, "restore stage", 0, func(d *dec) {
		st.id = d.str()
		st.last = d.uvarint()
		count = d.records()
		st.size = d.uvarint()
		if d.err == nil && (validRestoreID(st.id) != nil || st.size > MaxRestoreBytes) {
			d.fail("bad restore stage")
		}
	}); err != nil {
		return nil, err
	}
	var size uint64
	for i := 0; i < count; i++ {
		body, err := rr.next()
		if err != nil {
			return nil, fmt.Errorf("fsm: snapshot restore chunk %d: %w", i, err)
		}
		if len(body) == 0 || len(body) > MaxRestoreChunk {
			return nil, fmt.Errorf("fsm: snapshot restore chunk %d: %d bytes", i, len(body))
		}
		size += uint64(len(body))
		st.chunks = append(st.chunks, slices.Clone(body))
	}
	if size != st.size {
		return nil, fmt.Errorf("fsm: snapshot restore stage: %d bytes in chunks, %d named", size, st.size)
	}
	return st, nil
}

func (n rebuilder) setHeader(hdr snapHeader) {
	n.index, n.tick, n.periodMS, n.wallMS, n.fence = hdr.Index, hdr.Tick, hdr.PeriodMS, hdr.WallMS, hdr.Fence
	n.clusterID, n.sealCheck, n.features = hdr.ClusterID, hdr.SealCheck, hdr.Features
}

// maxPeekHeader bounds what PeekIndex looks at: the magic, a length and the
// header record (a cluster id and a seal check at most, well under it).
const maxPeekHeader = 4096

// PeekIndex returns the index of the state a snapshot holds (the last
// command applied: Snapshot's header), read from br's buffer without
// consuming anything, so that a caller can refuse a snapshot before it
// decodes the rest. ok is false when the header cannot be read that way (a
// format 1 snapshot, a damaged or short one): Restore then says what is
// wrong with it. br's buffer must hold at least 4096 bytes.
func PeekIndex(br *bufio.Reader) (index uint64, ok bool) {
	p, _ := br.Peek(min(maxPeekHeader, br.Size()))
	if len(p) < len(snapMagic) || string(p[:len(snapMagic)]) != snapMagic {
		return 0, false
	}
	p = p[len(snapMagic):]
	size, w := binary.Uvarint(p)
	if w <= 0 || size > uint64(len(p)-w) {
		return 0, false
	}
	var hdr snapHeader
	if err := decodeRecord(p[w:w+int(size)], "header", 0, hdr.decode); err != nil {
		return 0, false
	}
	return hdr.Index, true
}

// SnapshotCounts are the record counts a snapshot's header states.
type SnapshotCounts struct {
	Leases, Sessions, Keys int
	// Fence is the snapshot's fencing counter.
	Fence uint64
}

// PeekSnapshotCounts reads the header of the snapshot read from br without
// consuming anything (it peeks at most the header's bytes), so that a
// restore can be sized before the state is decoded. ok is false when br
// does not start with a binary snapshot's header (a format 1 snapshot, or
// not a snapshot).
func PeekSnapshotCounts(br *bufio.Reader) (c SnapshotCounts, ok bool) {
	b, _ := br.Peek(min(br.Size(), 4096))
	if len(b) < len(snapMagic) || string(b[:len(snapMagic)]) != snapMagic {
		return c, false
	}
	rr := &recordReader{r: bufio.NewReader(bytes.NewReader(b[len(snapMagic):]))}
	body, err := rr.next()
	if err != nil {
		return c, false
	}
	var hdr snapHeader
	if decodeRecord(body, "header", 0, hdr.decode) != nil {
		return c, false
	}
	return SnapshotCounts{Leases: hdr.Leases, Sessions: hdr.Sessions, Keys: hdr.Keys, Fence: hdr.Fence}, true
}

// Records is f's record counts, as a snapshot of it would state them.
func (f *FSM) Records() SnapshotCounts {
	return SnapshotCounts{Leases: f.leases.Len(), Sessions: len(f.sessions), Keys: f.keys.Len(), Fence: f.fence}
}
