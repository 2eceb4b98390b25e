package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"
)

// The version-2 log encoding: after the version and type bytes, the fields of
// the command in a fixed order per type, with nothing optional and nothing
// after them. Unsigned integers are uvarints and signed ones zigzag varints,
// both in their shortest form; strings (valid UTF-8) and byte slices are a
// uvarint length and the bytes; a Hash is its 32 bytes; a bool is one byte, 0
// or 1; a map is a uvarint count and its entries in strictly increasing key
// order; a list is a uvarint count and its items. A Batch body is a uvarint
// count (1..MaxBatch) and that many (type byte, body) pairs, none a Batch.
// Every command has exactly one encoding, and Decode accepts nothing else.
// Empty maps and slices decode as nil. Lengths and counts are checked
// against what is left of the input before anything is allocated for them.

// newBody returns a zero command of type t, or nil for an unknown type.
func newBody(t Type) Command {
	switch t {
	case TypeBatch:
		return new(Batch)
	case TypeTick:
		return new(Tick)
	case TypeTickLimited:
		return &Tick{ExpireMax: limitedMarker}
	case TypeExpire:
		return new(Expire)
	case TypeAcquire:
		return new(Acquire)
	case TypeRenew:
		return new(Renew)
	case TypeRenewMeta:
		return &Renew{SetMetadata: true}
	case TypeRelease:
		return new(Release)
	case TypeRevoke:
		return new(Revoke)
	case TypeHeartbeat, TypeHeartbeatMeta:
		return new(Heartbeat)
	case TypeSessionCreate:
		return new(SessionCreate)
	case TypeSessionHeartbeat:
		return new(SessionHeartbeat)
	case TypeSessionEnd:
		return new(SessionEnd)
	case TypeReleaseHolder:
		return new(ReleaseHolder)
	case TypeCancelWait:
		return new(CancelWait)
	case TypeMember:
		return new(Member)
	case TypeMemberKey:
		return new(MemberKey)
	case TypeClusterID:
		return new(ClusterID)
	case TypeSealCheck:
		return new(SealCheck)
	case TypeRestoreChunk:
		return new(RestoreChunk)
	case TypeRestoreCommit:
		return new(RestoreCommit)
	case TypeAcquireGroup:
		return new(AcquireGroup)
	case TypeRenewGroup:
		return new(RenewGroup)
	case TypeReleaseGroup:
		return new(ReleaseGroup)
	}
	return nil
}

// encodeBinary returns the version-2 entry of c.
func encodeBinary(c Command) ([]byte, error) {
	if c == nil {
		return nil, errors.New("fsm: cannot encode a nil command")
	}
	size := 256
	if b, ok := c.(*Batch); ok && b != nil {
		size = 16 + 128*min(len(b.Commands), MaxBatch)
	}
	e := enc{b: make([]byte, 0, size)}
	e.b = append(e.b, Version, byte(c.Type()))
	encodeFields(&e, c)
	if e.err != nil {
		return nil, e.err
	}
	return e.b, nil
}

// decodeBinary parses the body of a binary (version 2 or 3) entry of type t.
func decodeBinary(version byte, t Type, in []byte) (Command, error) {
	c := newBody(t)
	if c == nil || !knownIn(version, t) {
		return nil, fmt.Errorf("fsm: unknown command type %d", t)
	}
	d := dec{b: in, size: len(in), version: version}
	decodeFields(&d, t, c)
	if d.err == nil && len(d.b) > 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return nil, fmt.Errorf("fsm: decode %T: %w", c, d.err)
	}
	return c, nil
}

// knownIn reports whether binary entries of version may carry type t:
// the types of chunked expiry, of metadata renewals and of grant keys came
// with version 4
// (entries of earlier versions never carry them, so that a command keeps
// exactly one encoding).
func knownIn(version byte, t Type) bool {
	switch t {
	case TypeExpire, TypeTickLimited, TypeRenewMeta, TypeHeartbeatMeta, TypeMemberKey,
		TypeAcquireGroup, TypeRenewGroup, TypeReleaseGroup:
		return version >= versionBounds
	}
	return true
}

// encodeFields writes the body of c (what follows its type byte). It and
// decodeFields dispatch with a type switch rather than through an interface
// so that the enc and dec stay on the stack.
func encodeFields(e *enc, c Command) {
	ok := false
	switch c := c.(type) {
	case *Batch:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Tick:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Expire:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Acquire:
		if ok = c != nil; ok {
			c.encode(e)
			c.Quota.encode(e)
		}
	case *Renew:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Release:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Revoke:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Heartbeat:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *SessionCreate:
		if ok = c != nil; ok {
			c.encode(e)
			c.Quota.encode(e)
		}
	case *SessionHeartbeat:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *SessionEnd:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *ReleaseHolder:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *CancelWait:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *Member:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *MemberKey:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *ClusterID:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *SealCheck:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *RestoreChunk:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *RestoreCommit:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *AcquireGroup:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *RenewGroup:
		if ok = c != nil; ok {
			c.encode(e)
		}
	case *ReleaseGroup:
		if ok = c != nil; ok {
			c.encode(e)
		}
	}
	if !ok {
		e.fail(fmt.Errorf("fsm: cannot encode %T", c))
	}
}

// decodeFields reads the body of c, a command of type t from newBody.
func decodeFields(d *dec, t Type, c Command) {
	switch c := c.(type) {
	case *Batch:
		c.decode(d)
	case *Tick:
		c.decode(d)
	case *Expire:
		c.decode(d)
	case *Acquire:
		c.decode(d)
		if d.version >= versionQuota {
			c.Quota.decode(d)
		}
	case *Renew:
		c.decode(d)
	case *Release:
		c.decode(d)
	case *Revoke:
		c.decode(d)
	case *Heartbeat:
		c.decode(d, t == TypeHeartbeatMeta)
	case *SessionCreate:
		c.decode(d)
		if d.version >= versionQuota {
			c.Quota.decode(d)
		}
	case *SessionHeartbeat:
		c.decode(d)
	case *SessionEnd:
		c.decode(d)
	case *ReleaseHolder:
		c.decode(d)
	case *CancelWait:
		c.decode(d)
	case *Member:
		c.decode(d)
	case *MemberKey:
		c.decode(d)
	case *ClusterID:
		c.decode(d)
	case *SealCheck:
		c.decode(d)
	case *RestoreChunk:
		c.decode(d)
	case *RestoreCommit:
		c.decode(d)
	case *AcquireGroup:
		c.decode(d)
	case *RenewGroup:
		c.decode(d)
	case *ReleaseGroup:
		c.decode(d)
	default:
		d.fail(fmt.Sprintf("no decoder for %T", c)) // newBody returns none such
	}
}

// enc appends a version-2 encoding to b. The first error is kept in err.
type enc struct {
	b   []byte
	err error
}

func (e *enc) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

// varint writes v zigzag-encoded.
func (e *enc) varint(v int64) { e.b = binary.AppendVarint(e.b, v) }

// str writes s, with any byte that is not valid UTF-8 replaced by U+FFFD as
// the JSON encoding of version 1 did: a string decodes only if it is valid.
func (e *enc) str(s string) {
	if !utf8.ValidString(s) {
		s = toValidUTF8(s)
	}
	e.uvarint(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) bytes(p []byte) {
	e.uvarint(uint64(len(p)))
	e.b = append(e.b, p...)
}

func (e *enc) hash(h Hash) { e.b = append(e.b, h[:]...) }

func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// strmap writes the count of m and its entries sorted by key.
func (e *enc) strmap(m map[string]string) {
	var arr [MaxMetaEntries]string
	keys, valid := arr[:0], true
	for k := range m {
		keys = append(keys, k)
		valid = valid && utf8.ValidString(k)
	}
	if !valid {
		// Keys are made valid UTF-8 (as str does) before sorting, so they
		// must still be distinct afterwards.
		fixed := make(map[string]string, len(m))
		for k, v := range m {
			fixed[toValidUTF8(k)] = v
		}
		if len(fixed) != len(m) {
			e.fail(errors.New("fsm: map keys collide once made valid UTF-8"))
			return
		}
		e.strmap(fixed)
		return
	}
	slices.Sort(keys)
	e.uvarint(uint64(len(keys)))
	for _, k := range keys {
		e.str(k)
		e.str(m[k])
	}
}

// dec reads a version-2 encoding from b. The first error is kept in err;
// after it every read returns a zero value.
type dec struct {
	b       []byte // what is left to read
	size    int    // length of the whole input, for error offsets
	version byte   // of the entry: version 2 commands carry no Quota
	err     error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s at byte %d", what, d.size-len(d.b))
	}
	d.b = nil
}

// take returns the next n bytes (n <= len(d.b) is checked).
func (d *dec) take(n int) []byte {
	if n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// uvarint reads a uvarint in its shortest form.
func (d *dec) uvarint() uint64 {
	v, w := binary.Uvarint(d.b)
	switch {
	case w == 0:
		d.fail("truncated")
		return 0
	case w < 0:
		d.fail("varint overflows 64 bits")
		return 0
	case w > 1 && d.b[w-1] == 0:
		d.fail("varint not in its shortest form")
		return 0
	}
	d.b = d.b[w:]
	return v
}

// varint reads a zigzag-encoded varint.
func (d *dec) varint() int64 {
	u := d.uvarint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

func (d *dec) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("value overflows 32 bits")
		return 0
	}
	return uint32(v)
}

// count reads a number of items of at least minSize bytes each, which must
// fit in what is left.
func (d *dec) count(minSize int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/minSize) {
		d.fail(fmt.Sprintf("count %d is more than the rest of the input holds", n))
		return 0
	}
	return int(n)
}

func (d *dec) str() string { return string(d.strBytes()) }

// strPair reads two strings into one allocation (a lease's id and key live
// as long as each other: one allocation of 48 bytes instead of 24 and 32).
func (d *dec) strPair() (string, string) {
	a, b := d.strBytes(), d.strBytes()
	var arr [96]byte
	s := string(append(append(arr[:0], a...), b...))
	return s[:len(a)], s[len(a):]
}

// strBytes reads a string without copying it: the bytes are the input's.
func (d *dec) strBytes() []byte {
	n := d.count(1)
	p := d.take(n)
	if !utf8.Valid(p) {
		d.fail("string is not valid UTF-8")
		return nil
	}
	return p
}

// bytes reads a byte slice; empty is nil.
func (d *dec) bytes() []byte {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	return slices.Clone(d.take(n))
}

func (d *dec) hash() (h Hash) {
	copy(h[:], d.take(len(h)))
	return h
}

func (d *dec) bool() bool {
	switch p := d.take(1); {
	case p == nil:
		return false
	case p[0] > 1:
		d.fail(fmt.Sprintf("bool byte %d", p[0]))
		return false
	default:
		return p[0] == 1
	}
}

// strmap reads a map written by enc.strmap; empty is nil.
func (d *dec) strmap() map[string]string {
	n := d.count(2) // an entry is at least two empty strings
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	prev := ""
	for i := range n {
		k, v := d.str(), d.str()
		if d.err != nil {
			return nil
		}
		if i > 0 && k <= prev {
			d.fail("map keys not in strictly increasing order")
			return nil
		}
		m[k], prev = v, k
	}
	return m
}

// Per-type codecs: encode and decode list the fields in the same order.

func (c *Batch) encode(e *enc) {
	if len(c.Commands) == 0 || len(c.Commands) > MaxBatch {
		e.fail(fmt.Errorf("fsm: batch of %d commands", len(c.Commands)))
		return
	}
	e.uvarint(uint64(len(c.Commands)))
	for _, sub := range c.Commands {
		switch {
		case sub == nil:
			e.fail(errors.New("fsm: cannot encode a nil command"))
			return
		case sub.Type() == TypeBatch:
			e.fail(errors.New("fsm: nested batch"))
			return
		case sub.Type() == TypeRestoreChunk || sub.Type() == TypeRestoreCommit:
			e.fail(fmt.Errorf("fsm: command type %d in a batch", sub.Type()))
			return
		}
		e.b = append(e.b, byte(sub.Type()))
		encodeFields(e, sub)
	}
}

func (c *Batch) decode(d *dec) {
	n := d.count(1) // a command is at least its type byte
	switch {
	case d.err != nil:
		return
	case n == 0:
		d.fail("empty batch")
		return
	case n > MaxBatch:
		d.fail("batch too large")
		return
	}
	c.Commands = make([]Command, 0, n)
	for range n {
		p := d.take(1)
		if p == nil {
			return
		}
		t := Type(p[0])
		if t == TypeBatch {
			d.fail("nested batch")
			return
		}
		if t == TypeRestoreChunk || t == TypeRestoreCommit {
			d.fail(fmt.Sprintf("command type %d in a batch", t))
			return
		}
		sub := newBody(t)
		if sub == nil || !knownIn(d.version, t) {
			d.fail(fmt.Sprintf("unknown command type %d", t))
			return
		}
		decodeFields(d, t, sub)
		c.Commands = append(c.Commands, sub)
	}
}

func (c *Tick) encode(e *enc) {
	e.uvarint(c.Tick)
	e.varint(c.WallMS)
	e.varint(c.PeriodMS)
	e.uvarint(c.RetainTicks)
	e.uvarint(c.RetainMax)
	if c.ExpireMax > 0 {
		e.uvarint(c.ExpireMax) // TypeTickLimited
	}
}

func (c *Tick) decode(d *dec) {
	c.Tick = d.uvarint()
	c.WallMS = d.varint()
	c.PeriodMS = d.varint()
	c.RetainTicks = d.uvarint()
	if d.version >= versionBounds {
		c.RetainMax = d.uvarint()
	}
	if c.ExpireMax == limitedMarker { // TypeTickLimited (newBody)
		c.ExpireMax = d.uvarint()
		if d.err == nil && c.ExpireMax == 0 {
			d.fail("limited tick: expire_max must be positive")
		}
	}
}

func (c *Acquire) encode(e *enc) {
	e.str(c.LeaseID)
	e.str(c.Key)
	e.str(c.Holder)
	e.uvarint(uint64(c.Limit))
	e.str(c.SessionID)
	e.hash(c.SessionTokenHash)
	e.hash(c.TokenHash)
	e.varint(c.TTLMS)
	e.uvarint(c.TTLTicks)
	e.strmap(c.Metadata)
	e.hash(c.IdemHash)
	e.hash(c.Fingerprint)
	e.bytes(c.SealedToken)
	e.uvarint(c.WaitTicks)
	e.varint(c.LockDelayMS)
	e.uvarint(c.LockDelayTicks)
	e.varint(c.WallMS)
}

func (c *Acquire) decode(d *dec) {
	c.LeaseID, c.Key = d.strPair()
	c.Holder = d.str()
	c.Limit = d.uint32()
	c.SessionID = d.str()
	c.SessionTokenHash = d.hash()
	c.TokenHash = d.hash()
	c.TTLMS = d.varint()
	c.TTLTicks = d.uvarint()
	c.Metadata = d.strmap()
	c.IdemHash = d.hash()
	c.Fingerprint = d.hash()
	c.SealedToken = d.bytes()
	c.WaitTicks = d.uvarint()
	c.LockDelayMS = d.varint()
	c.LockDelayTicks = d.uvarint()
	c.WallMS = d.varint()
}

// Quota is written after the Acquire and SessionCreate bodies of version 3
// entries: the counts, in order; version 4 adds the waiter limits.
func (q *Quota) encode(e *enc) {
	e.uvarint(q.Leases)
	e.uvarint(q.HolderLeases)
	e.uvarint(q.Sessions)
	e.uvarint(q.HolderSessions)
	e.uvarint(q.KeyWaiters)
	e.uvarint(q.HolderWaiters)
}

func (q *Quota) decode(d *dec) {
	q.Leases = d.uvarint()
	q.HolderLeases = d.uvarint()
	q.Sessions = d.uvarint()
	q.HolderSessions = d.uvarint()
	if d.version >= versionBounds {
		q.KeyWaiters = d.uvarint()
		q.HolderWaiters = d.uvarint()
	}
}

func (c *Renew) encode(e *enc) {
	e.str(c.LeaseID)
	e.hash(c.TokenHash)
	e.varint(c.TTLMS)
	e.uvarint(c.TTLTicks)
	e.varint(c.WallMS)
	switch {
	case c.SetMetadata: // TypeRenewMeta
		e.strmap(c.Metadata)
	case len(c.Metadata) > 0:
		e.fail(errors.New("fsm: renew metadata without SetMetadata"))
	}
}

func (c *Renew) decode(d *dec) {
	c.LeaseID = d.str()
	c.TokenHash = d.hash()
	c.TTLMS = d.varint()
	c.TTLTicks = d.uvarint()
	c.WallMS = d.varint()
	if c.SetMetadata { // TypeRenewMeta (newBody)
		c.Metadata = d.strmap()
	}
}

func (c *Release) encode(e *enc) {
	e.str(c.LeaseID)
	e.hash(c.TokenHash)
	e.hash(c.SessionTokenHash)
	e.str(c.Reason)
	e.varint(c.WallMS)
}

func (c *Release) decode(d *dec) {
	c.LeaseID = d.str()
	c.TokenHash = d.hash()
	c.SessionTokenHash = d.hash()
	c.Reason = d.str()
	c.WallMS = d.varint()
}

func (c *Revoke) encode(e *enc) {
	e.str(c.LeaseID)
	e.str(c.Reason)
	e.varint(c.WallMS)
}

func (c *Revoke) decode(d *dec) {
	c.LeaseID = d.str()
	c.Reason = d.str()
	c.WallMS = d.varint()
}

// heartbeatItemBytes is the least an encoded HeartbeatItem takes: an empty
// lease id and a hash; in a TypeHeartbeatMeta entry also the flag and an
// empty map.
const (
	heartbeatItemBytes     = 1 + len(Hash{})
	heartbeatMetaItemBytes = heartbeatItemBytes + 2
)

// A TypeHeartbeatMeta body is a TypeHeartbeat body whose items each carry
// SetMetadata (a bool) and Metadata (a map, empty unless SetMetadata) after
// the hash; at least one item sets metadata.
func (c *Heartbeat) encode(e *enc) {
	meta := c.Type() == TypeHeartbeatMeta
	e.uvarint(uint64(len(c.Items)))
	for _, it := range c.Items {
		e.str(it.LeaseID)
		e.hash(it.TokenHash)
		if !it.SetMetadata && len(it.Metadata) > 0 {
			e.fail(errors.New("fsm: heartbeat item metadata without SetMetadata"))
			return
		}
		if meta {
			e.bool(it.SetMetadata)
			e.strmap(it.Metadata)
		}
	}
	e.varint(c.WallMS)
}

func (c *Heartbeat) decode(d *dec, meta bool) {
	size := heartbeatItemBytes
	if meta {
		size = heartbeatMetaItemBytes
	}
	sets := false
	if n := d.count(size); n > 0 {
		c.Items = make([]HeartbeatItem, n)
		for i := range c.Items {
			it := &c.Items[i]
			it.LeaseID = d.str()
			it.TokenHash = d.hash()
			if meta {
				it.SetMetadata = d.bool()
				it.Metadata = d.strmap()
				if d.err == nil && !it.SetMetadata && it.Metadata != nil {
					d.fail("heartbeat item metadata without its flag")
				}
				sets = sets || it.SetMetadata
			}
		}
	}
	c.WallMS = d.varint()
	if meta && d.err == nil && !sets {
		d.fail("metadata heartbeat without an item that sets metadata")
	}
}

func (c *SessionCreate) encode(e *enc) {
	e.str(c.SessionID)
	e.str(c.Holder)
	e.hash(c.TokenHash)
	e.varint(c.TTLMS)
	e.uvarint(c.TTLTicks)
	e.strmap(c.Metadata)
	e.varint(c.WallMS)
}

func (c *SessionCreate) decode(d *dec) {
	c.SessionID = d.str()
	c.Holder = d.str()
	c.TokenHash = d.hash()
	c.TTLMS = d.varint()
	c.TTLTicks = d.uvarint()
	c.Metadata = d.strmap()
	c.WallMS = d.varint()
}

func (c *SessionHeartbeat) encode(e *enc) {
	e.str(c.SessionID)
	e.hash(c.TokenHash)
	e.varint(c.WallMS)
}

func (c *SessionHeartbeat) decode(d *dec) {
	c.SessionID = d.str()
	c.TokenHash = d.hash()
	c.WallMS = d.varint()
}

func (c *SessionEnd) encode(e *enc) {
	e.str(c.SessionID)
	e.hash(c.TokenHash)
	e.bool(c.Force)
	e.varint(c.WallMS)
}

func (c *SessionEnd) decode(d *dec) {
	c.SessionID = d.str()
	c.TokenHash = d.hash()
	c.Force = d.bool()
	c.WallMS = d.varint()
}

func (c *ReleaseHolder) encode(e *enc) {
	e.str(c.Holder)
	e.str(c.Reason)
	e.varint(c.WallMS)
}

func (c *ReleaseHolder) decode(d *dec) {
	c.Holder = d.str()
	c.Reason = d.str()
	c.WallMS = d.varint()
}

func (c *CancelWait) encode(e *enc) {
	e.str(c.LeaseID)
	e.str(c.Key)
}

func (c *CancelWait) decode(d *dec) {
	c.LeaseID = d.str()
	c.Key = d.str()
}

func (c *Member) encode(e *enc) {
	e.str(c.ID)
	e.str(c.Incarnation)
	e.bool(c.Removed)
}

func (c *Member) decode(d *dec) {
	c.ID = d.str()
	c.Incarnation = d.str()
	c.Removed = d.bool()
}
