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

// bodies gives, for each command type, the first version whose entries may
// carry it and a new zero command of it. Entries of earlier versions never
// carry a type (so that a command keeps exactly one encoding): version 1
// (JSON) knows the first thirteen, version 2 adds cluster ids, seal checks,
// restores and features, version 4 the rest.
var bodies = [...]struct {
	since byte
	new   func() Command
}{
	TypeBatch:                {versionJSON, func() Command { return new(Batch) }},
	TypeTick:                 {versionJSON, func() Command { return new(Tick) }},
	TypeAcquire:              {versionJSON, func() Command { return new(Acquire) }},
	TypeRenew:                {versionJSON, func() Command { return new(Renew) }},
	TypeRelease:              {versionJSON, func() Command { return new(Release) }},
	TypeRevoke:               {versionJSON, func() Command { return new(Revoke) }},
	TypeHeartbeat:            {versionJSON, func() Command { return new(Heartbeat) }},
	TypeSessionCreate:        {versionJSON, func() Command { return new(SessionCreate) }},
	TypeSessionHeartbeat:     {versionJSON, func() Command { return new(SessionHeartbeat) }},
	TypeSessionEnd:           {versionJSON, func() Command { return new(SessionEnd) }},
	TypeReleaseHolder:        {versionJSON, func() Command { return new(ReleaseHolder) }},
	TypeCancelWait:           {versionJSON, func() Command { return new(CancelWait) }},
	TypeMember:               {versionJSON, func() Command { return new(Member) }},
	TypeClusterID:            {versionBinary, func() Command { return new(ClusterID) }},
	TypeSealCheck:            {versionBinary, func() Command { return new(SealCheck) }},
	TypeRestoreChunk:         {versionBinary, func() Command { return new(RestoreChunk) }},
	TypeRestoreCommit:        {versionBinary, func() Command { return new(RestoreCommit) }},
	TypeFeatures:             {versionBinary, func() Command { return new(FeaturesCmd) }},
	TypeExpire:               {versionBounds, func() Command { return new(Expire) }},
	TypeTickLimited:          {versionBounds, func() Command { return &Tick{ExpireMax: limitedMarker} }},
	TypeRenewMeta:            {versionBounds, func() Command { return &Renew{SetMetadata: true} }},
	TypeHeartbeatMeta:        {versionBounds, func() Command { return new(Heartbeat) }},
	TypeMemberKey:            {versionBounds, func() Command { return new(MemberKey) }},
	TypeAcquireGroup:         {versionBounds, func() Command { return new(AcquireGroup) }},
	TypeRenewGroup:           {versionBounds, func() Command { return new(RenewGroup) }},
	TypeReleaseGroup:         {versionBounds, func() Command { return new(ReleaseGroup) }},
	TypeSessionHeartbeatMeta: {versionBounds, func() Command { return &SessionHeartbeat{SetMetadata: true} }},
	TypeRestoreCommitBounded: {versionBounds, func() Command { return new(RestoreCommit) }},
	TypeTickPruned:           {versionBounds, func() Command { return &Tick{ExpireMax: limitedMarker, PruneMax: limitedMarker} }},
}

// newBody returns a zero command of type t, or nil for a type unknown in
// entries of version.
func newBody(version byte, t Type) Command {
	if int(t) >= len(bodies) || bodies[t].new == nil || version < bodies[t].since {
		return nil
	}
	return bodies[t].new()
}

// newerType reports whether type t, for which newBody returned nil, was
// written by a newer release (ErrUnknownType): a type after every type
// this release knows, in a checked entry. Otherwise the entry is damaged
// (a type never used, a type in an entry of a version that never carries
// it, a type byte without a checksum to vouch for it).
func newerType(version byte, t Type) bool {
	return version == VersionChecked && int(t) >= len(bodies)
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

// decodeBinary parses the body of a binary entry of type t: of version 2,
// 3 or 4, or VersionChecked for a version-4 body whose checksum held.
func decodeBinary(version byte, t Type, in []byte) (Command, error) {
	c := newBody(version, t)
	if c == nil {
		if newerType(version, t) {
			return nil, fmt.Errorf("%w: type %d", ErrUnknownType, t)
		}
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
