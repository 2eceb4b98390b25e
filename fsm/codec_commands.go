package fsm

import (
	"errors"
	"fmt"
)

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
		case sub.Type() == TypeRestoreChunk || sub.Type() == TypeRestoreCommit || sub.Type() == TypeRestoreCommitBounded:
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
		if t == TypeRestoreChunk || t == TypeRestoreCommit || t == TypeRestoreCommitBounded {
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
	switch {
	case c.SetMetadata: // TypeSessionHeartbeatMeta
		e.strmap(c.Metadata)
	case len(c.Metadata) > 0:
		e.fail(errors.New("fsm: session heartbeat metadata without SetMetadata"))
	}
}

func (c *SessionHeartbeat) decode(d *dec) {
	c.SessionID = d.str()
	c.TokenHash = d.hash()
	c.WallMS = d.varint()
	if c.SetMetadata { // TypeSessionHeartbeatMeta (newBody)
		c.Metadata = d.strmap()
	}
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
