package fsm

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// SnapshotFormat is the version of the snapshot encoding.
const SnapshotFormat = 1

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
}

type snapKey struct {
	Key     string    `json:"key"`
	Limit   uint32    `json:"limit"`
	Blocked []blocked `json:"blocked,omitempty"`
	Waiters []waiter  `json:"waiters,omitempty"`
	Stolen  []string  `json:"stolen,omitempty"`
}

// Snapshot is a point-in-time image of the state. Taking it is cheap (it
// shares the copy-on-write records); WriteTo does the encoding and may run
// concurrently with further Apply calls.
type Snapshot struct {
	hdr      snapHeader
	leases   []*Lease
	sessions []*Session
	keys     []snapKey
}

// Snapshot captures the current state.
func (f *FSM) Snapshot() *Snapshot {
	s := &Snapshot{hdr: snapHeader{Format: SnapshotFormat, Index: f.index, Tick: f.tick,
		PeriodMS: f.periodMS, WallMS: f.wallMS, Fence: f.fence}}
	s.leases = make([]*Lease, 0, len(f.leases))
	for _, l := range f.leases {
		s.leases = append(s.leases, l)
	}
	s.sessions = make([]*Session, 0, len(f.sessions))
	for _, x := range f.sessions {
		s.sessions = append(s.sessions, x)
	}
	for k, ks := range f.keys {
		s.keys = append(s.keys, snapKey{Key: k, Limit: ks.limit, Blocked: slices.Clone(ks.blocked),
			Waiters: slices.Clone(ks.waiters), Stolen: slices.Clone(ks.stolen)})
	}
	s.hdr.Leases, s.hdr.Sessions, s.hdr.Keys = len(s.leases), len(s.sessions), len(s.keys)
	return s
}

// Index is the log index the snapshot reflects.
func (s *Snapshot) Index() uint64 { return s.hdr.Index }

// WriteTo encodes the snapshot: a header line, then leases, sessions and
// keys as JSON lines, each group sorted, so equal states give equal bytes.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	slices.SortFunc(s.leases, func(a, b *Lease) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.sessions, func(a, b *Session) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.keys, func(a, b snapKey) int { return strings.Compare(a.Key, b.Key) })
	cw := &countWriter{w: bufio.NewWriterSize(w, 1<<16)}
	enc := json.NewEncoder(cw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s.hdr); err != nil {
		return cw.n, err
	}
	for _, l := range s.leases {
		if err := enc.Encode(l); err != nil {
			return cw.n, err
		}
	}
	for _, x := range s.sessions {
		if err := enc.Encode(x); err != nil {
			return cw.n, err
		}
	}
	for _, k := range s.keys {
		if err := enc.Encode(k); err != nil {
			return cw.n, err
		}
	}
	return cw.n, cw.w.(*bufio.Writer).Flush()
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

// Restore replaces the whole state with the snapshot read from r. On error
// the FSM is left unchanged.
func (f *FSM) Restore(r io.Reader) error {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 1<<16))
	dec.DisallowUnknownFields()
	var hdr snapHeader
	if err := dec.Decode(&hdr); err != nil {
		return fmt.Errorf("fsm: snapshot header: %w", err)
	}
	if hdr.Format != SnapshotFormat {
		return fmt.Errorf("fsm: unknown snapshot format %d", hdr.Format)
	}
	n := New()
	n.index, n.tick, n.periodMS, n.wallMS, n.fence = hdr.Index, hdr.Tick, hdr.PeriodMS, hdr.WallMS, hdr.Fence
	for i := 0; i < hdr.Leases; i++ {
		l := new(Lease)
		if err := dec.Decode(l); err != nil {
			return fmt.Errorf("fsm: snapshot lease %d: %w", i, err)
		}
		n.leases[l.ID] = l
	}
	for i := 0; i < hdr.Sessions; i++ {
		s := new(Session)
		if err := dec.Decode(s); err != nil {
			return fmt.Errorf("fsm: snapshot session %d: %w", i, err)
		}
		n.sessions[s.ID] = s
	}
	for i := 0; i < hdr.Keys; i++ {
		var k snapKey
		if err := dec.Decode(&k); err != nil {
			return fmt.Errorf("fsm: snapshot key %d: %w", i, err)
		}
		for _, w := range k.Waiters {
			if w.Cmd == nil {
				return fmt.Errorf("fsm: snapshot key %d: waiter without a command", i)
			}
		}
		n.keys[k.Key] = &keyState{limit: k.Limit, blocked: k.Blocked, waiters: k.Waiters, stolen: k.Stolen}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("fsm: trailing data in snapshot")
	}
	if err := n.rebuild(); err != nil {
		return err
	}
	*f = *n
	return nil
}

// rebuild derives every index from the records.
func (n *FSM) rebuild() error {
	var active []*Lease
	var ended []pruneItem
	for _, l := range n.leases {
		n.order.insert(l.ID)
		if !l.IdemHash.IsZero() {
			n.idem[l.IdemHash] = l.ID
		}
		if l.Terminal() {
			ended = append(ended, pruneItem{tick: l.EndedTick, kind: kindLease, id: l.ID})
			continue
		}
		active = append(active, l)
	}
	slices.SortFunc(active, func(a, b *Lease) int { return cmp.Compare(a.Fence, b.Fence) })
	for _, l := range active {
		ks := n.keys[l.Key]
		if ks == nil {
			return fmt.Errorf("fsm: snapshot: active lease %s on key without state", l.ID)
		}
		ks.active = append(ks.active, l.ID)
		n.active++
		n.holder(l.Holder).leases[l.ID] = struct{}{}
		if l.SessionID == "" {
			n.schedule(l.ExpiresTick+GraceTicks, kindLease, l.ID)
		}
	}
	for _, s := range n.sessions {
		n.sessIDs.insert(s.ID)
		if s.State != SessionActive {
			ended = append(ended, pruneItem{tick: s.EndedTick, kind: kindSession, id: s.ID})
			continue
		}
		n.sessOpen++
		n.holder(s.Holder).sessions[s.ID] = struct{}{}
		n.schedule(s.ExpiresTick+GraceTicks, kindSession, s.ID)
	}
	for key, ks := range n.keys {
		for _, w := range ks.waiters {
			n.waiting[w.Cmd.LeaseID] = key
			n.schedule(w.Deadline, kindWait, key+"\x00"+w.Cmd.LeaseID)
			if !w.Cmd.IdemHash.IsZero() {
				n.idem[w.Cmd.IdemHash] = w.Cmd.LeaseID
			}
		}
		for _, b := range ks.blocked {
			n.schedule(b.Until, kindDelay, key)
		}
	}
	slices.SortFunc(ended, func(a, b pruneItem) int {
		return cmp.Or(cmp.Compare(a.tick, b.tick), cmp.Compare(a.kind, b.kind), strings.Compare(a.id, b.id))
	})
	n.prune = ended
	return nil
}
