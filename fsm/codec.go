package fsm

import (
	"errors"
	"fmt"
	"reflect"
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
	t := c.Type()
	e := enc{b: make([]byte, 0, size)}
	e.b = append(e.b, Version, byte(t))
	fields{e: &e}.body(t, c)
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
	fields{d: &d}.body(t, c)
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

// body writes or reads the body of c, of type t (what follows its type
// byte).
func (f fields) body(t Type, c Command) {
	if !bodyFields(f, t, c) {
		f.refuse(fmt.Errorf("fsm: cannot encode %T", c))
		f.reject(true, fmt.Sprintf("no decoder for %T", c)) // newBody returns none such
	}
}

// bodyFields writes or reads the body of c, of type t, and reports whether
// it could: not for a nil command, nor one of another package. It
// dispatches with a type switch rather than through an interface so that
// the enc and dec stay on the stack.
func bodyFields(f fields, t Type, c Command) bool {
	if v := reflect.ValueOf(c); !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil() {
		return false
	}
	switch c := c.(type) {
	case *Batch:
		c.fields(f)
	case *Tick:
		c.fields(f)
	case *Expire:
		c.fields(f)
	case *Acquire:
		c.fields(f)
		c.Quota.fields(f) // not in the snapshot records of waiters
	case *Renew:
		c.fields(f)
	case *Release:
		c.fields(f)
	case *Revoke:
		c.fields(f)
	case *Heartbeat:
		c.fields(f, t == TypeHeartbeatMeta)
	case *SessionCreate:
		c.fields(f)
	case *SessionHeartbeat:
		c.fields(f)
	case *SessionEnd:
		c.fields(f)
	case *ReleaseHolder:
		c.fields(f)
	case *CancelWait:
		c.fields(f)
	case *Member:
		c.fields(f)
	case *MemberKey:
		c.fields(f)
	case *ClusterID:
		c.fields(f)
	case *SealCheck:
		c.fields(f)
	case *FeaturesCmd:
		c.fields(f)
	case *RestoreChunk:
		c.fields(f)
	case *RestoreCommit:
		c.fields(f, t == TypeRestoreCommitBounded)
	case *AcquireGroup:
		c.fields(f)
	case *RenewGroup:
		c.fields(f)
	case *ReleaseGroup:
		c.fields(f)
	default:
		return false
	}
	return true
}
