package fsm

import (
	"errors"
	"fmt"
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
	case TypeSessionHeartbeatMeta:
		return &SessionHeartbeat{SetMetadata: true}
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
	case TypeFeatures:
		return new(FeaturesCmd)
	case TypeRestoreChunk:
		return new(RestoreChunk)
	case TypeRestoreCommit, TypeRestoreCommitBounded:
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
		TypeAcquireGroup, TypeRenewGroup, TypeReleaseGroup, TypeSessionHeartbeatMeta, TypeRestoreCommitBounded:
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
	case *FeaturesCmd:
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
	case *FeaturesCmd:
		c.decode(d)
	case *RestoreChunk:
		c.decode(d)
	case *RestoreCommit:
		c.decode(d, t)
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
