package fsm

import "fmt"

// Codecs (codec.go's style). An AcquireGroup is the group id, a count
// (1..MaxGroupKeys) of (lease id, key, limit), the holder, then the fields
// Acquire writes after its limit (fields.acquire), and the Quota.

func (c *AcquireGroup) fields(f fields) {
	f.str(&c.GroupID)
	n := f.count(len(c.Keys), 3) // a key is at least two empty strings and a limit
	if n == 0 || n > MaxGroupKeys {
		f.fail(fmt.Sprintf("lease group of %d keys", n))
		return
	}
	if f.d != nil {
		c.Keys = make([]GroupKey, n)
	}
	for i := range c.Keys {
		f.strPair(&c.Keys[i].LeaseID, &c.Keys[i].Key)
		f.uint32(&c.Keys[i].Limit)
	}
	f.str(&c.Holder)
	f.acquire(&c.SessionID, &c.SessionTokenHash, &c.TokenHash, &c.TTLMS, &c.TTLTicks, &c.Metadata,
		&c.IdemHash, &c.Fingerprint, &c.SealedToken, &c.WaitTicks, &c.LockDelayMS, &c.LockDelayTicks, &c.WallMS)
	c.Quota.fields(f)
}

func (c *RenewGroup) fields(f fields) {
	f.renew(&c.GroupID, &c.TokenHash, &c.TTLMS, &c.TTLTicks, &c.WallMS)
}

func (c *ReleaseGroup) fields(f fields) {
	f.release(&c.GroupID, &c.TokenHash, &c.SessionTokenHash, &c.Reason, &c.WallMS)
}
