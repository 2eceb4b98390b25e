package fsm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// snapshotFormatJSON is format 1: JSON lines (a header, then leases,
// sessions and keys). WriteTo no longer writes it; Restore still reads it so
// that the snapshots of older data directories restore.
const snapshotFormatJSON = 1

// snapKeyV1 is a key as format 1 has it.
type snapKeyV1 struct {
	Key     string    `json:"key"`
	Limit   uint32    `json:"limit"`
	Blocked []blocked `json:"blocked,omitempty"`
	Waiters []waiter  `json:"waiters,omitempty"`
	Stolen  []string  `json:"stolen,omitempty"`
}

// leaseV1 is a lease as format 1 has it.
type leaseV1 struct {
	Lease
	IdemHash    Hash   `json:"idem_hash,omitzero"`
	Fingerprint Hash   `json:"fingerprint,omitzero"`
	SealedToken []byte `json:"sealed_token,omitempty"`
	// The fields a Lease keeps apart (leaseCold).
	EndedTick      uint64            `json:"ended_tick,omitempty"`
	EndedWallMS    int64             `json:"ended_wall_ms,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	EndReason      string            `json:"end_reason,omitempty"`
	LockDelayTicks uint64            `json:"lock_delay_ticks,omitempty"`
}

// restoreJSON reads a format 1 snapshot into a new state machine.
func restoreJSON(br *bufio.Reader) (*FSM, error) {
	dec := json.NewDecoder(br)
	dec.DisallowUnknownFields()
	var hdr snapHeader
	if err := dec.Decode(&hdr); err != nil {
		return nil, fmt.Errorf("fsm: snapshot header: %w", err)
	}
	if hdr.Format != snapshotFormatJSON {
		return nil, fmt.Errorf("fsm: unknown snapshot format %d", hdr.Format)
	}
	leases, sessions, keys, err := decodeV1Records(dec, hdr)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("fsm: trailing data in snapshot")
	}
	if err := sortV1Records(leases, sessions, keys); err != nil {
		return nil, err
	}
	n := New()
	rebuilder{n}.setHeader(hdr)
	recs := make([]keyRec, len(keys))
	n.keys.reserve(len(keys))
	for i, k := range keys {
		recs[i] = keyRec{key: k.Key, ks: newKeyState(k.Key, k.Limit, keyMore{blocked: k.Blocked, stolen: k.Stolen}), waiters: k.Waiters}
		n.keys.Put(recs[i].ks)
	}
	for _, x := range sessions {
		n.sessions[x.ID] = x
	}
	if err := (rebuilder{n}).rebuild(recs, sessions, leases, nil); err != nil {
		return nil, err
	}
	return n, nil
}

// decodeV1Records decodes the lease, session and key records the header
// counts.
func decodeV1Records(dec *json.Decoder, hdr snapHeader) ([]*Lease, []*Session, []snapKeyV1, error) {
	var leases []*Lease
	for i := 0; i < hdr.Leases; i++ {
		var v leaseV1
		if err := dec.Decode(&v); err != nil {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot lease %d: %w", i, err)
		}
		l := &v.Lease
		l.idem = newLeaseIdem(v.IdemHash, v.Fingerprint, v.SealedToken)
		l.cold = leaseCold{metadata: nilIfEmpty(v.Metadata), lockDelayTicks: v.LockDelayTicks,
			endedTick: v.EndedTick, endedWallMS: v.EndedWallMS, endReason: v.EndReason}.orNil()
		if !slices.Contains(leaseStates, l.State) {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot lease %d: unknown state %q", i, l.State)
		}
		if l.Limit > MaxLimit {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot lease %d: limit %d above %d", i, l.Limit, MaxLimit)
		}
		leases = append(leases, l)
	}
	var sessions []*Session
	for i := 0; i < hdr.Sessions; i++ {
		s := new(Session)
		if err := dec.Decode(s); err != nil {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot session %d: %w", i, err)
		}
		if !slices.Contains(sessionStates, s.State) {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot session %d: unknown state %q", i, s.State)
		}
		sessions = append(sessions, s)
	}
	var keys []snapKeyV1
	for i := 0; i < hdr.Keys; i++ {
		var k snapKeyV1
		if err := dec.Decode(&k); err != nil {
			return nil, nil, nil, fmt.Errorf("fsm: snapshot key %d: %w", i, err)
		}
		keys = append(keys, k)
	}
	return leases, sessions, keys, nil
}

// sortV1Records sorts each group of records by id or key and refuses
// duplicates.
func sortV1Records(leases []*Lease, sessions []*Session, keys []snapKeyV1) error {
	// Format 1 wrote each group sorted too, but did not insist on it when
	// reading: sort here, and refuse duplicates.
	slices.SortStableFunc(leases, func(a, b *Lease) int { return strings.Compare(a.ID, b.ID) })
	slices.SortStableFunc(sessions, func(a, b *Session) int { return strings.Compare(a.ID, b.ID) })
	slices.SortStableFunc(keys, func(a, b snapKeyV1) int { return strings.Compare(a.Key, b.Key) })
	for i := 1; i < len(leases); i++ {
		if leases[i].ID == leases[i-1].ID {
			return fmt.Errorf("fsm: snapshot: duplicate lease %s", leases[i].ID)
		}
	}
	for i := 1; i < len(sessions); i++ {
		if sessions[i].ID == sessions[i-1].ID {
			return fmt.Errorf("fsm: snapshot: duplicate session %s", sessions[i].ID)
		}
	}
	for i := 1; i < len(keys); i++ {
		if keys[i].Key == keys[i-1].Key {
			return fmt.Errorf("fsm: snapshot: duplicate key %q", keys[i].Key)
		}
	}
	return nil
}
