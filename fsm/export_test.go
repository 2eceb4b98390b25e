package fsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Test hooks into the snapshot format.

// SnapKey is the record of one key in a snapshot.
type SnapKey = snapKeyV1

// SnapshotKeys returns the key records of a format 2 snapshot.
func SnapshotKeys(snap []byte) ([]SnapKey, error) {
	br := bufio.NewReader(bytes.NewReader(snap))
	if _, err := br.Peek(1); err != nil {
		return nil, err
	}
	n, err := restoreBinary(br)
	if err != nil {
		return nil, err
	}
	var out []SnapKey
	for _, k := range n.keys.sortedNames() {
		ks := n.keys.Get(k)
		out = append(out, SnapKey{Key: k, Limit: ks.limit, Blocked: ks.blocked(), Waiters: ks.waiters(), Stolen: ks.stolen()})
	}
	return out, nil
}

// WriteSnapshotV1 writes s in format 1 (JSON lines), as WriteTo did before
// format 2, for the tests of reading it.
func WriteSnapshotV1(s *Snapshot, w io.Writer) error {
	s.sort()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	hdr := s.hdr
	hdr.Format = snapshotFormatJSON
	if err := enc.Encode(hdr); err != nil {
		return err
	}
	for _, i := range s.leaseOrder {
		l := s.leases[i]
		if err := enc.Encode(leaseV1{Lease: *l, IdemHash: l.idemHash(), Fingerprint: l.fingerprint(), SealedToken: l.SealedToken(),
			EndedTick: l.EndedTick(), EndedWallMS: l.EndedWallMS(), Metadata: l.Metadata(), EndReason: l.EndReason(), LockDelayTicks: l.LockDelayTicks()}); err != nil {
			return err
		}
	}
	for _, i := range s.sessionOrder {
		if err := enc.Encode(s.sessions[i]); err != nil {
			return err
		}
	}
	for _, i := range s.keyOrder {
		k := s.keys[i]
		v := SnapKey{Key: k.key, Limit: k.limit}
		if k.more != nil {
			v.Blocked, v.Waiters, v.Stolen = k.more.blocked, k.more.waitq.list(), k.more.stolen
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

// SnapMagic starts a format 2 snapshot.
const SnapMagic = snapMagic

// SplitSnapshot returns the record bodies of a format 2 snapshot (header
// first) without decoding them.
func SplitSnapshot(snap []byte) ([][]byte, error) {
	if !bytes.HasPrefix(snap, []byte(snapMagic)) {
		return nil, errors.New("no magic")
	}
	rest := snap[len(snapMagic):]
	var out [][]byte
	for len(rest) > 0 {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return nil, errors.New("bad framing")
		}
		out = append(out, rest[w:w+int(n)])
		rest = rest[w+int(n):]
	}
	return out, nil
}

// JoinSnapshot frames record bodies as a format 2 snapshot.
func JoinSnapshot(records [][]byte) []byte {
	out := []byte(snapMagic)
	for _, r := range records {
		out = binary.AppendUvarint(out, uint64(len(r)))
		out = append(out, r...)
	}
	return out
}

// EncodeHeaderRecord encodes a header record with the given counts.
func EncodeHeaderRecord(format, index, tick uint64, keys, sessions, leases int) []byte {
	e := enc{}
	h := snapHeader{Index: index, Tick: tick, PeriodMS: 1000, Fence: index, Keys: keys, Sessions: sessions, Leases: leases}
	h.encode(&e)
	if format != SnapshotFormat {
		b := binary.AppendUvarint(nil, format)
		return append(b, e.b[1:]...)
	}
	return e.b
}

// EncodeLeaseRecord encodes the record of l.
func EncodeLeaseRecord(l *Lease) []byte {
	e := enc{}
	encodeLease(&e, l)
	if e.err != nil {
		panic(e.err)
	}
	return e.b
}

// EncodeKeyRecord encodes the record of a key.
func EncodeKeyRecord(k SnapKey) []byte {
	e := enc{}
	sk := snapKey{key: k.Key, limit: k.Limit, more: &keyMore{blocked: k.Blocked, waitq: newWaitQueue(k.Waiters), stolen: k.Stolen}}
	sk.encode(&e)
	if e.err != nil {
		panic(e.err)
	}
	return e.b
}

// MarkEnded records the end of l, a record the caller made.
func MarkEnded(l *Lease, state State, reason string, tick uint64, wallMS int64) {
	l.markEnded(state, reason, tick, wallMS)
}

// CheckPruneQueue reports an error unless f's prune queue lists, once
// each, exactly the ended leases and sessions with the ticks they ended
// at. An entry naming a record that is gone, active again or ended at
// another tick would be dropped by pruning without pruning anything, and
// the replicas whose queues hold it and those whose do not would cut
// their chunks at different records.
func CheckPruneQueue(f *FSM) error {
	type item = pruneItem
	want := map[item]int{}
	for l := range f.leases.All() {
		if l.Terminal() {
			want[item{tick: l.EndedTick(), kind: kindLease, id: l.ID}]++
		}
	}
	for _, s := range f.sessions {
		if s.State != SessionActive {
			want[item{tick: s.EndedTick, kind: kindSession, id: s.ID}]++
		}
	}
	for i, p := range f.prune {
		if want[p] == 0 {
			return fmt.Errorf("prune queue entry %d (tick %d, kind %d, id %q) names no record ended at that tick, or names it twice", i, p.tick, p.kind, p.id)
		}
		want[p]--
	}
	for p, n := range want {
		if n > 0 {
			return fmt.Errorf("ended record (tick %d, kind %d, id %q) is not in the prune queue", p.tick, p.kind, p.id)
		}
	}
	return nil
}
