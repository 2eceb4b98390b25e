package fsm

import "fmt"

// Codecs (codec.go's style). An AcquireGroup is the group id, a count
// (1..MaxGroupKeys) of (lease id, key, limit), then the fields Acquire
// writes after them, in the same order, and the Quota.

func (c *AcquireGroup) encode(e *enc) {
	if len(c.Keys) == 0 || len(c.Keys) > MaxGroupKeys {
		e.fail(fmt.Errorf("fsm: lease group of %d keys", len(c.Keys)))
		return
	}
	e.str(c.GroupID)
	e.uvarint(uint64(len(c.Keys)))
	for _, k := range c.Keys {
		e.str(k.LeaseID)
		e.str(k.Key)
		e.uvarint(uint64(k.Limit))
	}
	e.str(c.Holder)
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
	c.Quota.encode(e)
}

func (c *AcquireGroup) decode(d *dec) {
	c.GroupID = d.str()
	n := d.count(3) // a key is at least two empty strings and a limit
	if d.err == nil && (n == 0 || n > MaxGroupKeys) {
		d.fail(fmt.Sprintf("lease group of %d keys", n))
		return
	}
	c.Keys = make([]GroupKey, n)
	for i := range c.Keys {
		c.Keys[i].LeaseID, c.Keys[i].Key = d.strPair()
		c.Keys[i].Limit = d.uint32()
	}
	c.Holder = d.str()
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
	c.Quota.decode(d)
}

func (c *RenewGroup) encode(e *enc) {
	e.str(c.GroupID)
	e.hash(c.TokenHash)
	e.varint(c.TTLMS)
	e.uvarint(c.TTLTicks)
	e.varint(c.WallMS)
}

func (c *RenewGroup) decode(d *dec) {
	c.GroupID = d.str()
	c.TokenHash = d.hash()
	c.TTLMS = d.varint()
	c.TTLTicks = d.uvarint()
	c.WallMS = d.varint()
}

func (c *ReleaseGroup) encode(e *enc) {
	e.str(c.GroupID)
	e.hash(c.TokenHash)
	e.hash(c.SessionTokenHash)
	e.str(c.Reason)
	e.varint(c.WallMS)
}

func (c *ReleaseGroup) decode(d *dec) {
	c.GroupID = d.str()
	c.TokenHash = d.hash()
	c.SessionTokenHash = d.hash()
	c.Reason = d.str()
	c.WallMS = d.varint()
}
