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

func (f fields) state(p *State, states []State) {
	if f.e != nil {
		f.e.state(*p, states)
	} else {
		*p = f.d.state(states)
	}
}

// interned is a string read with intern, which returns the string of its
// bytes (shared with other records).
func (f fields) interned(p *string, intern func([]byte) string) {
	if f.e != nil {
		f.e.str(*p)
	} else {
		*p = intern(f.d.strBytes())
	}
}

func (h *snapHeader) encode(e *enc) { h.fields(fields{e: e}) }
func (h *snapHeader) decode(d *dec) { h.fields(fields{d: d}) }

// fields of the header. Each field after the counts is written only when it
// or one after it is set (an empty cluster id only before a seal check, an
// empty check only before features), so that there is one encoding.
func (h *snapHeader) fields(f fields) {
	format := uint64(SnapshotFormat)
	f.uvarint(&format)
	f.reject(format != SnapshotFormat, fmt.Sprintf("unknown snapshot format %d", format))
	if f.d != nil {
		h.Format = SnapshotFormat
	}
	f.uvarint(&h.Index)
	f.uvarint(&h.Tick)
	f.varint(&h.PeriodMS)
	f.varint(&h.WallMS)
	f.uvarint(&h.Fence)
	f.records(&h.Keys)
	f.records(&h.Sessions)
	f.records(&h.Leases)
	features := h.Features != 0
	check := h.SealCheck != "" || features
	id := h.ClusterID != "" || check
	more := func(set bool) bool { return f.e != nil && set || f.d != nil && len(f.d.b) > 0 }
	end := func() bool { return f.d != nil && len(f.d.b) == 0 } // of a decoding
	if more(h.Members > 0 || id) {
		f.records(&h.Members)
		f.reject(h.Members == 0 && end(), "member count 0 written")
	}
	if more(id) {
		f.str(&h.ClusterID)
		if err := ValidClusterID(h.ClusterID); err != nil && (h.ClusterID != "" || end()) {
			f.reject(true, "bad cluster id: "+err.Message)
		}
	}
	if more(check) {
		b := []byte(h.SealCheck)
		if f.bytes(&b); f.d != nil {
			h.SealCheck = string(b)
		}
		n := len(h.SealCheck)
		f.reject(n == 0 && end() || n > MaxSealCheckBytes, fmt.Sprintf("seal check of %d bytes", n))
	}
	if more(features) {
		f.uvarint((*uint64)(&h.Features))
		f.reject(h.Features == 0, "features 0 written")
	}
}

// records writes or reads a count of records.
func (f fields) records(p *int) { field(f, p, (*enc).records, (*dec).records) }

func (e *enc) records(n int) { e.uvarint(uint64(n)) }

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
	ws := m.waitq.list()
	keyFields(fields{e: e}, &k.key, &k.limit, &m, &ws)
}

func decodeKey(d *dec, k *keyRec) {
	var m keyMore
	var limit uint32
	keyFields(fields{d: d}, &k.key, &limit, &m, &k.waiters)
	k.ks = newKeyState(k.key, limit, m)
}

// keyFields writes or reads a key record: the key, its limit, lock-delay
// blocks, waiters (each a deadline and an Acquire without its Quota), the
// ids of stolen leases and, only when a lease group is queued on the key
// (group.go), so that other keys keep their bytes, each waiter's group ("" for
// an acquire of one key).
func keyFields(f fields, key *string, limit *uint32, m *keyMore, ws *[]waiter) {
	f.str(key)
	f.uint32(limit)
	list(f, &m.blocked, 2, func(b *blocked) {
		f.uvarint(&b.Until)
		f.str(&b.LeaseID)
	})
	list(f, ws, waiterBytes, func(w *waiter) {
		if f.d != nil {
			w.Cmd = new(Acquire)
		} else if w.Cmd == nil {
			f.refuse(errors.New("fsm: waiter without a command"))
			return
		}
		f.uvarint(&w.Deadline)
		w.Cmd.fields(f)
	})
	list(f, &m.stolen, 1, f.str)
	grouped := func(w waiter) bool { return w.group != "" }
	if f.e != nil && slices.ContainsFunc(*ws, grouped) || f.d != nil && len(f.d.b) > 0 && f.d.err == nil {
		for i := range *ws {
			f.str(&(*ws)[i].group)
		}
		f.reject(!slices.ContainsFunc(*ws, grouped), "waiter groups written without a lease group")
	}
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

// sessionFields writes or reads a session; holder (reading) returns the
// string of the holder's name, shared with its other records.
func sessionFields(f fields, s *Session, holder func([]byte) string) {
	f.str(&s.ID)
	f.interned(&s.Holder, holder)
	f.state(&s.State, sessionStates)
	f.hash(&s.TokenHash)
	f.varint(&s.TTLMS)
	f.uvarint(&s.TTLTicks)
	f.uvarint(&s.ExpiresTick)
	f.varint(&s.CreatedWallMS)
	f.varint(&s.LastHeartbeat)
	f.uvarint(&s.HeartbeatCount)
	f.strmap(&s.Metadata)
	list(f, &s.LeaseIDs, 1, f.str)
	f.uvarint(&s.EndedTick)
	f.varint(&s.EndedWallMS)
	f.interned(&s.EndReason, internReason)
}

// encodeLease writes a lease. The idempotency hashes, zero for most leases,
// follow a bool saying whether either is set (it is 1 only if one is).
func encodeLease(e *enc, l *Lease) {
	e.str(l.ID)
	e.str(l.Key)
	e.str(l.Holder)
	e.uvarint(uint64(l.Limit))
	e.str(l.SessionID)
	leaseFields(fields{e: e}, l)
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

// leaseFields writes or reads the fields of a lease from its state to its
// lock-delay, the cold ones among them.
func leaseFields(f fields, l *Lease) {
	f.state(&l.State, leaseStates)
	f.uvarint(&l.Fence)
	f.hash(&l.TokenHash)
	f.varint(&l.TTLMS)
	f.uvarint(&l.TTLTicks)
	f.uvarint(&l.ExpiresTick)
	f.uvarint(&l.AcquiredTick)
	f.varint(&l.AcquiredWallMS)
	f.varint(&l.RenewedWallMS)
	var c leaseCold
	if l.cold != nil {
		c = *l.cold
	}
	f.uvarint(&c.endedTick)
	f.varint(&c.endedWallMS)
	f.uint32(&l.RenewalCount)
	f.strmap(&c.metadata)
	f.interned(&c.endReason, internReason)
	f.uvarint(&c.lockDelayTicks)
	if f.d != nil {
		l.cold = c.orNil()
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
	leaseFields(fields{d: d}, l)
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
