package fsm

import (
	"errors"
	"fmt"
	"slices"
)

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
		return 0
	case int(p[0]) >= len(states):
		d.fail(fmt.Sprintf("unknown state %d", p[0]))
		return 0
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
	more := h.Features != 0
	if h.Members > 0 || h.ClusterID != "" || h.SealCheck != "" || more {
		e.uvarint(uint64(h.Members))
	}
	if h.ClusterID != "" || h.SealCheck != "" || more {
		e.str(h.ClusterID)
	}
	if h.SealCheck != "" || more {
		e.bytes([]byte(h.SealCheck))
	}
	if more {
		e.uvarint(uint64(h.Features))
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
		// An empty check is written only before features.
		h.SealCheck = string(d.bytes())
		if n := len(h.SealCheck); (n == 0 && len(d.b) == 0 || n > MaxSealCheckBytes) && d.err == nil {
			d.fail(fmt.Sprintf("seal check of %d bytes", n))
		}
	}
	if len(d.b) > 0 && d.err == nil {
		// Written only when not zero.
		if h.Features = Features(d.uvarint()); h.Features == 0 && d.err == nil {
			d.fail("features 0 written")
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
		w.Cmd.fields(fields{e: e})
	}
	e.uvarint(uint64(len(m.stolen)))
	for _, id := range m.stolen {
		e.str(id)
	}
	if slices.ContainsFunc(ws, func(w waiter) bool { return w.group != "" }) {
		// Only when a lease group is queued on the key (group.go), so
		// that other keys keep their bytes: each waiter's group, "" for
		// an acquire of one key.
		for _, w := range ws {
			e.str(w.group)
		}
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
			c.fields(fields{d: d})
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
	if len(d.b) > 0 && d.err == nil {
		grouped := false
		for i := range k.waiters {
			k.waiters[i].group = d.str()
			grouped = grouped || k.waiters[i].group != ""
		}
		if !grouped && d.err == nil {
			d.fail("waiter groups written without a lease group")
		}
	}
	k.ks = newKeyState(k.key, limit, m)
}

// newKeyState returns the state of a key read from a snapshot. Most keys
// have nothing but a limit: their state has no keyMore (allocating one only
// for tidy to drop it cost 128 bytes of garbage a key).
func newKeyState(key string, limit uint32, m keyMore) *keyState {
	ks := &keyState{key: key, limit: limit}
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

func (n rebuilder) decodeSession(d *dec, s *Session) {
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
	e.uvarint(l.EndedTick())
	e.varint(l.EndedWallMS())
	e.uvarint(uint64(l.RenewalCount))
	e.strmap(l.Metadata())
	e.str(l.EndReason())
	e.uvarint(l.LockDelayTicks())
	e.bool(l.hasIdemHashes())
	if l.hasIdemHashes() {
		e.hash(l.idem.hash)
		e.hash(l.idem.fingerprint)
	}
	e.bytes(l.SealedToken())
	if g := l.GroupID(); g != "" {
		// Only for a member of a lease group (group.go), so that other
		// leases keep their bytes.
		e.str(g)
	}
}

// leaseDecoder decodes the lease records of a snapshot. It only reads the
// state (the key states and sessions, restored before the leases), and
// interns holder names in a map of its own, so that it can run beside the
// rebuild, which enters holders in the state's holder index.
type leaseDecoder struct {
	n       *FSM
	holders map[string]string
}

func newLeaseDecoder(n *FSM) *leaseDecoder {
	ld := &leaseDecoder{n: n, holders: make(map[string]string, len(n.holders))}
	for name := range n.holders {
		ld.holders[name] = name // the sessions' holders
	}
	return ld
}

// holder returns the holder named b, its string shared with every record
// of the holder.
func (ld *leaseDecoder) holder(b []byte) string {
	if h, ok := ld.holders[string(b)]; ok {
		return h
	}
	h := string(b)
	ld.holders[h] = h
	return h
}

// decodeLease reads a lease and returns the state of its key (nil when the
// key has none: only an ended lease's key may lack one). Its key shares the
// string of its key's state, as it does when a grant makes both; its
// holder, session id and end reason share the strings of other records.
// (The key states are read before the leases.)
func (ld *leaseDecoder) decodeLease(d *dec, l *Lease) *keyState {
	n := ld.n
	id, key := d.strBytes(), d.strBytes()
	ks := n.keys.Get(string(key))
	if ks != nil {
		l.ID, l.Key = string(id), ks.key
	} else {
		var arr [96]byte
		idKey := string(append(append(arr[:0], id...), key...))
		l.ID, l.Key = idKey[:len(id)], idKey[len(id):]
	}
	l.Holder = ld.holder(d.strBytes())
	if limit := d.uint32(); limit > MaxLimit {
		d.fail(fmt.Sprintf("lease limit %d above %d", limit, MaxLimit))
	} else {
		l.Limit = uint16(limit)
	}
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
	var c leaseCold
	c.endedTick = d.uvarint()
	c.endedWallMS = d.varint()
	l.RenewalCount = d.uint32()
	c.metadata = d.strmap()
	c.endReason = internReason(d.strBytes())
	c.lockDelayTicks = d.uvarint()
	l.cold = c.orNil()
	var h, fp Hash
	if d.bool() {
		if h, fp = d.hash(), d.hash(); h.IsZero() && fp.IsZero() && d.err == nil {
			d.fail("idempotency hashes flagged but zero")
		}
	}
	l.idem = newLeaseIdem(h, fp, d.bytes())
	if len(d.b) > 0 && d.err == nil {
		g := d.str()
		if (g == "" || len(g) > MaxIDBytes) && d.err == nil {
			d.fail(fmt.Sprintf("lease group id of %d bytes", len(g)))
		}
		l.idem = withGroup(l.idem, g)
	}
	return ks
}
