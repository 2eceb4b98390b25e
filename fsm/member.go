package fsm

import (
	"slices"
	"strings"

	"github.com/leasehold/leasehold/wire"
)

// The member registry: which data directory (incarnation) each server of the
// cluster was added with, and which servers an operator removed. The cluster
// layer proposes Member commands when it adds or removes a server; it reads
// the registry to refuse a removed server that comes back, and a server that
// returns under an old id with a new (wiped) data directory. The registry
// never touches leases, sessions, ticks or fences and emits no events; its
// records are never pruned. See DESIGN.md.

// Limits of a Member command.
const (
	MaxServerIDBytes    = 128
	MaxIncarnationBytes = 64
)

// MemberRecord is a server in the member registry.
type MemberRecord struct {
	ID          string
	Incarnation string
	Removed     bool   // a tombstone: the operator removed the server
	Index       uint64 // the log index of the Member command that wrote it
	// GrantKeys are the server's grant signing keys (grantkey.go); nil
	// when none was recorded. Shared, never modified in place.
	GrantKeys *GrantKeys `json:"-"`
}

// ValidMember checks a Member command: an id of 1-128 bytes of UTF-8
// without control characters, an incarnation of 0-64 bytes of printable
// ASCII (0x20-0x7E).
func ValidMember(c *Member) *wire.Error {
	if err := validName("id", c.ID, MaxServerIDBytes); err != nil {
		return err
	}
	if len(c.Incarnation) > MaxIncarnationBytes {
		return InvalidField("incarnation", "incarnation must be at most %d bytes, got %d", MaxIncarnationBytes, len(c.Incarnation))
	}
	for i := 0; i < len(c.Incarnation); i++ {
		if b := c.Incarnation[i]; b < 0x20 || b > 0x7E {
			return InvalidField("incarnation", "incarnation must be printable ASCII")
		}
	}
	return nil
}

// member applies a Member command: it writes (or overwrites) the record of
// the server. Its grant keys stay, but a tombstone or another incarnation
// retires its current one.
func (r *registry) member(c *Member) Result {
	if err := ValidMember(c); err != nil {
		return Result{Err: err}
	}
	rec := MemberRecord{ID: c.ID, Incarnation: c.Incarnation, Removed: c.Removed, Index: r.index}
	if old, ok := r.members[c.ID]; ok && old.GrantKeys != nil {
		rec.GrantKeys = old.GrantKeys
		if c.Removed || c.Incarnation != old.Incarnation {
			rec.GrantKeys = old.GrantKeys.retireCurrent(r.tick)
		}
	}
	r.members[c.ID] = rec
	return Result{}
}

// Member returns the registry's record of server id.
func (r *registry) Member(id string) (MemberRecord, bool) {
	m, ok := r.members[id]
	return m, ok
}

// Members returns every record of the registry (tombstones included),
// ordered by id.
func (r *registry) Members() []MemberRecord {
	out := make([]MemberRecord, 0, len(r.members))
	for _, m := range r.members {
		out = append(out, m)
	}
	sortMembers(out)
	return out
}

func sortMembers(ms []MemberRecord) {
	slices.SortFunc(ms, func(a, b MemberRecord) int { return strings.Compare(a.ID, b.ID) })
}

// Snapshot record of a member: id, incarnation, removed, index, then its
// grant keys if it has any (grantkey.go).

func encodeMember(e *enc, m *MemberRecord) {
	e.str(m.ID)
	e.str(m.Incarnation)
	e.bool(m.Removed)
	e.uvarint(m.Index)
	encodeGrantKeys(e, m.GrantKeys)
}

func decodeMember(d *dec, m *MemberRecord) {
	m.ID = d.str()
	m.Incarnation = d.str()
	m.Removed = d.bool()
	m.Index = d.uvarint()
	m.GrantKeys = decodeGrantKeys(d)
}
