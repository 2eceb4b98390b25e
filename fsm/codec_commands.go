package fsm

import (
	"errors"
	"fmt"
	"slices"
)

// Per-type codecs: each body lists its fields once, in order (fields in
// codec_prims.go writes or reads them).

func (c *Batch) fields(f fields) {
	n := f.count(len(c.Commands), 1) // a command is at least its type byte
	if n == 0 || n > MaxBatch {
		f.refuse(fmt.Errorf("fsm: batch of %d commands", n))
		f.reject(n == 0, "empty batch")
		f.reject(true, "batch too large")
		return
	}
	if f.d != nil {
		c.Commands = make([]Command, n)
	}
	for i, sub := range c.Commands {
		var t Type
		if sub != nil {
			t = sub.Type()
		} else if f.e != nil {
			f.refuse(errors.New("fsm: cannot encode a nil command"))
			return
		}
		f.typ(&t)
		switch {
		case t == TypeBatch:
			f.fail("nested batch")
			return
		case t == TypeRestoreChunk || t == TypeRestoreCommit || t == TypeRestoreCommitBounded:
			f.fail(fmt.Sprintf("command type %d in a batch", t))
			return
		case f.d != nil:
			if sub = newBody(f.d.version, t); sub == nil {
				if newerType(f.d.version, t) {
					f.d.failWith(fmt.Errorf("%w: type %d", ErrUnknownType, t))
				} else {
					f.d.fail(fmt.Sprintf("unknown command type %d", t))
				}
				return
			}
			c.Commands[i] = sub
		}
		f.body(t, sub)
	}
}

// A TypeTickLimited body is a TypeTick body and ExpireMax; a
// TypeTickPruned body is a TypeTickLimited body and PruneMax.
func (c *Tick) fields(f fields) {
	f.uvarint(&c.Tick)
	f.varint(&c.WallMS)
	f.varint(&c.PeriodMS)
	f.uvarint(&c.RetainTicks)
	if f.since(versionBounds) {
		f.uvarint(&c.RetainMax)
	}
	if c.ExpireMax > 0 || c.PruneMax > 0 { // TypeTickLimited or TypeTickPruned (newBody marks one read with limitedMarker)
		if c.ExpireMax == 0 {
			f.refuse(errors.New("fsm: a tick with prune_max needs expire_max"))
		}
		f.uvarint(&c.ExpireMax)
		f.reject(c.ExpireMax == 0, "limited tick: expire_max must be positive")
	}
	if c.PruneMax > 0 {
		f.uvarint(&c.PruneMax)
		f.reject(c.PruneMax == 0, "pruned tick: prune_max must be positive")
	}
}

// fields of an Acquire; its Quota follows in a log entry (bodyFields),
// not in a snapshot's waiter.
func (c *Acquire) fields(f fields) {
	f.strPair(&c.LeaseID, &c.Key)
	f.str(&c.Holder)
	f.uint32(&c.Limit)
	f.acquire(&c.SessionID, &c.SessionTokenHash, &c.TokenHash, &c.TTLMS, &c.TTLTicks, &c.Metadata,
		&c.IdemHash, &c.Fingerprint, &c.SealedToken, &c.WaitTicks, &c.LockDelayMS, &c.LockDelayTicks, &c.WallMS)
}

// acquire is the rest of an Acquire after its limit, and of an
// AcquireGroup after its holder.
func (f fields) acquire(sessionID *string, sessionToken, token *Hash, ttlMS *int64, ttlTicks *uint64, metadata *map[string]string,
	idem, fingerprint *Hash, sealed *[]byte, waitTicks *uint64, delayMS *int64, delayTicks *uint64, wallMS *int64) {
	f.str(sessionID)
	f.hash(sessionToken)
	f.hash(token)
	f.varint(ttlMS)
	f.uvarint(ttlTicks)
	f.strmap(metadata)
	f.hash(idem)
	f.hash(fingerprint)
	f.bytes(sealed)
	f.uvarint(waitTicks)
	f.varint(delayMS)
	f.uvarint(delayTicks)
	f.varint(wallMS)
}

// Quota is written after the Acquire and SessionCreate bodies of version 3
// entries: the counts, in order; version 4 adds the waiter limits.
func (q *Quota) fields(f fields) {
	if !f.since(versionQuota) {
		return
	}
	f.uvarint(&q.Leases)
	f.uvarint(&q.HolderLeases)
	f.uvarint(&q.Sessions)
	f.uvarint(&q.HolderSessions)
	if f.since(versionBounds) {
		f.uvarint(&q.KeyWaiters)
		f.uvarint(&q.HolderWaiters)
	}
}

// A TypeRenewMeta body is a TypeRenew body and Metadata.
func (c *Renew) fields(f fields) {
	f.renew(&c.LeaseID, &c.TokenHash, &c.TTLMS, &c.TTLTicks, &c.WallMS)
	f.setMetadata(c.SetMetadata, &c.Metadata, "renew")
}

// renew is the body of a Renew (before its metadata) and of a RenewGroup.
func (f fields) renew(id *string, token *Hash, ttlMS *int64, ttlTicks *uint64, wallMS *int64) {
	f.str(id)
	f.hash(token)
	f.varint(ttlMS)
	f.uvarint(ttlTicks)
	f.varint(wallMS)
}

// setMetadata is the metadata of a command whose type says it sets it (a
// decoded one's flag is set by newBody); without the flag there is none.
func (f fields) setMetadata(set bool, m *map[string]string, what string) {
	switch {
	case set:
		f.strmap(m)
	case len(*m) > 0:
		f.refuse(errors.New("fsm: " + what + " metadata without SetMetadata"))
	}
}

func (c *Release) fields(f fields) {
	f.release(&c.LeaseID, &c.TokenHash, &c.SessionTokenHash, &c.Reason, &c.WallMS)
}

// release is the body of a Release and of a ReleaseGroup.
func (f fields) release(id *string, token, sessionToken *Hash, reason *string, wallMS *int64) {
	f.str(id)
	f.hash(token)
	f.hash(sessionToken)
	f.str(reason)
	f.varint(wallMS)
}

func (c *Revoke) fields(f fields) {
	f.str(&c.LeaseID)
	f.str(&c.Reason)
	f.varint(&c.WallMS)
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
func (c *Heartbeat) fields(f fields, meta bool) {
	size := heartbeatItemBytes
	if meta {
		size = heartbeatMetaItemBytes
	}
	list(f, &c.Items, size, func(it *HeartbeatItem) {
		f.str(&it.LeaseID)
		f.hash(&it.TokenHash)
		if !it.SetMetadata && len(it.Metadata) > 0 {
			f.refuse(errors.New("fsm: heartbeat item metadata without SetMetadata"))
		}
		if meta {
			f.bool(&it.SetMetadata)
			f.strmap(&it.Metadata)
			f.reject(!it.SetMetadata && it.Metadata != nil, "heartbeat item metadata without its flag")
		}
	})
	f.varint(&c.WallMS)
	sets := slices.ContainsFunc(c.Items, func(it HeartbeatItem) bool { return it.SetMetadata })
	f.reject(meta && !sets, "metadata heartbeat without an item that sets metadata")
}

func (c *SessionCreate) fields(f fields) {
	f.str(&c.SessionID)
	f.str(&c.Holder)
	f.hash(&c.TokenHash)
	f.varint(&c.TTLMS)
	f.uvarint(&c.TTLTicks)
	f.strmap(&c.Metadata)
	f.varint(&c.WallMS)
	c.Quota.fields(f)
}

// A TypeSessionHeartbeatMeta body is a TypeSessionHeartbeat body and
// Metadata.
func (c *SessionHeartbeat) fields(f fields) {
	f.str(&c.SessionID)
	f.hash(&c.TokenHash)
	f.varint(&c.WallMS)
	f.setMetadata(c.SetMetadata, &c.Metadata, "session heartbeat")
}

func (c *SessionEnd) fields(f fields) {
	f.str(&c.SessionID)
	f.hash(&c.TokenHash)
	f.bool(&c.Force)
	f.varint(&c.WallMS)
}

func (c *ReleaseHolder) fields(f fields) {
	f.str(&c.Holder)
	f.str(&c.Reason)
	f.varint(&c.WallMS)
}

func (c *CancelWait) fields(f fields) {
	f.str(&c.LeaseID)
	f.str(&c.Key)
}

func (c *Member) fields(f fields) {
	f.str(&c.ID)
	f.str(&c.Incarnation)
	f.bool(&c.Removed)
}
