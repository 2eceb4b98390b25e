package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Version is the encoding version of commands in the log. It is the first
// byte of every entry. Encode writes version 4 (binary bodies, codec.go:
// version 3 plus the waiter limits of Quota and the RetainMax of Tick);
// Decode also reads version 3 (Quota without waiter limits), version 2
// (binary, no Quota) and version 1 (JSON bodies) so that older logs
// replay.
const Version byte = 4

// versionJSON is the version of entries with JSON bodies.
const versionJSON byte = 1

// versionBinary is the first version with binary bodies; versionQuota the
// first whose Acquire and SessionCreate carry a Quota.
const (
	versionBinary byte = 2
	versionQuota  byte = 3
	versionBounds byte = 4
)

// Type says which command an entry carries. It is the second byte of every
// entry.
type Type byte

// Command types. Values are part of the log format: never renumber.
const (
	TypeBatch            Type = 1
	TypeTick             Type = 2
	TypeAcquire          Type = 3
	TypeRenew            Type = 4
	TypeRelease          Type = 5
	TypeRevoke           Type = 6
	TypeHeartbeat        Type = 7
	TypeSessionCreate    Type = 8
	TypeSessionHeartbeat Type = 9
	TypeSessionEnd       Type = 10
	TypeReleaseHolder    Type = 11
	TypeCancelWait       Type = 12
	TypeMember           Type = 13
)

// MaxBatch bounds the number of commands in one Batch entry.
const MaxBatch = 4096

// Hash is a 32-byte digest: the SHA-256 of a secret token, or the value that
// names an idempotent request (see Acquire.IdemHash). It is 32 raw bytes in
// the log and lowercase hex in JSON.
type Hash [32]byte

// HashOf returns the SHA-256 of s.
func HashOf(s string) Hash { return sha256.Sum256([]byte(s)) }

// IsZero reports whether h is the zero hash (meaning "none").
func (h Hash) IsZero() bool { return h == Hash{} }

// MarshalText encodes h as hex.
func (h Hash) MarshalText() ([]byte, error) {
	out := make([]byte, 64)
	hex.Encode(out, h[:])
	return out, nil
}

// UnmarshalText decodes 64 hex characters.
func (h *Hash) UnmarshalText(b []byte) error {
	if len(b) != 64 {
		return fmt.Errorf("hash: want 64 hex characters, got %d", len(b))
	}
	_, err := hex.Decode(h[:], b)
	return err
}

// Command is one decoded log command.
type Command interface{ Type() Type }

// Tick advances the cluster clock by one tick. Only the leader proposes it.
type Tick struct {
	// Tick is the tick this entry establishes; it applies only if it is
	// exactly one past the current tick (a duplicate is ignored).
	Tick uint64 `json:"tick"`
	// WallMS is the leader's wall clock in Unix milliseconds, for display.
	WallMS int64 `json:"wall_ms"`
	// PeriodMS is the leader's tick period; the first tick fixes it.
	PeriodMS int64 `json:"period_ms"`
	// RetainTicks: terminal records that ended this many ticks ago are pruned.
	RetainTicks uint64 `json:"retain_ticks"`
	// RetainMax bounds the terminal records kept (leases and sessions
	// together): beyond it the oldest are pruned, whatever their age.
	// 0: no bound. Version 4 and later.
	RetainMax uint64 `json:"retain_max,omitempty"`
	// ExpireMax bounds the records this tick ends; the rest wait for
	// Expire entries (expire.go). 0: no bound. A
	// Tick with it set is written as TypeTickLimited.
	ExpireMax uint64 `json:"expire_max,omitempty"`
	// PruneMax bounds the ended records this tick prunes; the rest wait
	// for the next ticks (prune.go). 0: no bound. A Tick with it set, and
	// ExpireMax too, is written as TypeTickPruned.
	PruneMax uint64 `json:"prune_max,omitempty"`
}

// Quota carries the node's count limits in the commands that create
// leases and sessions, so that every replica enforces them identically at
// apply time (a pre-check before proposing would let concurrent proposals
// both pass). Zero means no limit. Acquire uses Leases and HolderLeases,
// SessionCreate Sessions and HolderSessions; the other fields are carried
// but ignored. The node decides the values before proposing.
type Quota struct {
	// Leases bounds the live leases of the cluster: active ones plus
	// queued acquires.
	Leases uint64 `json:"max_leases,omitempty"`
	// HolderLeases bounds the active leases of one holder.
	HolderLeases uint64 `json:"max_holder_leases,omitempty"`
	// Sessions bounds the active sessions of the cluster.
	Sessions uint64 `json:"max_sessions,omitempty"`
	// HolderSessions bounds the active sessions of one holder.
	HolderSessions uint64 `json:"max_holder_sessions,omitempty"`
	// KeyWaiters bounds the queued acquires (wait_ms) of one key, and
	// HolderWaiters those of one holder (version 4 and later).
	KeyWaiters    uint64 `json:"max_key_waiters,omitempty"`
	HolderWaiters uint64 `json:"max_holder_waiters,omitempty"`
}

// Acquire asks for a lease on Key.
type Acquire struct {
	LeaseID   string `json:"lease_id"`
	Key       string `json:"key"`
	Holder    string `json:"holder"`
	Limit     uint32 `json:"limit"`
	SessionID string `json:"session_id,omitempty"`
	// SessionTokenHash authenticates a bound acquire.
	SessionTokenHash Hash `json:"session_token_hash,omitzero"`
	// TokenHash is the hash of the new lease's secret token.
	TokenHash Hash              `json:"token_hash"`
	TTLMS     int64             `json:"ttl_ms,omitempty"`
	TTLTicks  uint64            `json:"ttl_ticks,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// IdemHash names the idempotent request (holder, session, idempotency
	// key); zero when none. The state machine only compares it: the node
	// decides what it is (node/seal.go): an HMAC under the cluster's sealing
	// key, or, in entries written without one, an unkeyed SHA-256. Either
	// replays as written.
	IdemHash Hash `json:"idem_hash,omitzero"`
	// Fingerprint identifies the request for idempotency comparison.
	Fingerprint Hash `json:"fingerprint,omitzero"`
	// SealedToken is the token encrypted under a key derived from the
	// idempotency key (and the sealing key, when the cluster has one), so
	// that a replay can return it; never the clear token.
	SealedToken    []byte `json:"sealed_token,omitempty"`
	WaitTicks      uint64 `json:"wait_ticks,omitempty"`
	LockDelayMS    int64  `json:"lock_delay_ms,omitempty"`
	LockDelayTicks uint64 `json:"lock_delay_ticks,omitempty"`
	WallMS         int64  `json:"wall_ms"`
	// Quota is checked when the acquire is applied (not again when a
	// queued acquire is granted later). Not stored with a queued acquire
	// in snapshots.
	Quota Quota `json:"quota,omitzero"`
}

// Renew extends a standalone lease.
type Renew struct {
	LeaseID   string `json:"lease_id"`
	TokenHash Hash   `json:"token_hash"`
	// TTLMS/TTLTicks replace the lease's TTL when non-zero.
	TTLMS    int64  `json:"ttl_ms,omitempty"`
	TTLTicks uint64 `json:"ttl_ticks,omitempty"`
	WallMS   int64  `json:"wall_ms"`
	// SetMetadata: the renewal replaces the lease's metadata with Metadata
	// (empty: clears it), if it succeeds. A Renew with it set is written
	// as TypeRenewMeta (renewmeta.go); Metadata must be empty without it.
	Metadata    map[string]string `json:"metadata,omitempty"`
	SetMetadata bool              `json:"set_metadata,omitempty"`
}

// Release ends a lease voluntarily.
type Release struct {
	LeaseID string `json:"lease_id"`
	// TokenHash is the lease token's hash; SessionTokenHash may stand in for
	// it on a bound lease.
	TokenHash        Hash   `json:"token_hash,omitzero"`
	SessionTokenHash Hash   `json:"session_token_hash,omitzero"`
	Reason           string `json:"reason,omitempty"`
	WallMS           int64  `json:"wall_ms"`
}

// Revoke ends a lease by operator force.
type Revoke struct {
	LeaseID string `json:"lease_id"`
	Reason  string `json:"reason,omitempty"`
	WallMS  int64  `json:"wall_ms"`
}

// HeartbeatItem is one lease in a bulk renewal.
type HeartbeatItem struct {
	LeaseID   string `json:"lease_id"`
	TokenHash Hash   `json:"token_hash"`
	// Metadata and SetMetadata as in Renew: a Heartbeat with an item that
	// sets metadata is written as TypeHeartbeatMeta (renewmeta.go).
	Metadata    map[string]string `json:"metadata,omitempty"`
	SetMetadata bool              `json:"set_metadata,omitempty"`
}

// Heartbeat renews many standalone leases, each with its own TTL.
type Heartbeat struct {
	Items  []HeartbeatItem `json:"items"`
	WallMS int64           `json:"wall_ms"`
}

// SessionCreate creates a session.
type SessionCreate struct {
	SessionID string            `json:"session_id"`
	Holder    string            `json:"holder"`
	TokenHash Hash              `json:"token_hash"`
	TTLMS     int64             `json:"ttl_ms"`
	TTLTicks  uint64            `json:"ttl_ticks"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	WallMS    int64             `json:"wall_ms"`
	// Quota is checked when the session is created.
	Quota Quota `json:"quota,omitzero"`
}

// SessionHeartbeat renews a session and so every lease bound to it.
type SessionHeartbeat struct {
	SessionID string `json:"session_id"`
	TokenHash Hash   `json:"token_hash"`
	WallMS    int64  `json:"wall_ms"`
	// SetMetadata: the heartbeat replaces the session's metadata with
	// Metadata (empty: clears it), if it succeeds: a worker's statistics
	// sent with each heartbeat. A SessionHeartbeat with it set is written
	// as TypeSessionHeartbeatMeta (sessionmeta.go); Metadata must be empty
	// without it.
	Metadata    map[string]string `json:"metadata,omitempty"`
	SetMetadata bool              `json:"set_metadata,omitempty"`
}

// SessionEnd ends a session; its leases end with reason "session_ended".
type SessionEnd struct {
	SessionID string `json:"session_id"`
	// TokenHash must match unless Force (an admin request) is set.
	TokenHash Hash  `json:"token_hash,omitzero"`
	Force     bool  `json:"force,omitempty"`
	WallMS    int64 `json:"wall_ms"`
}

// ReleaseHolder ends every active lease and session of a holder at once
// (crash recovery of a restarted worker). No lock-delay applies.
type ReleaseHolder struct {
	Holder string `json:"holder"`
	Reason string `json:"reason,omitempty"`
	WallMS int64  `json:"wall_ms"`
}

// CancelWait withdraws a queued acquire whose requester gave up.
type CancelWait struct {
	LeaseID string `json:"lease_id"`
	Key     string `json:"key"`
}

// Member records a server of the cluster in the member registry
// (member.go): the data directory it was added with, or a tombstone once an
// operator removed it. A later Member for the same ID replaces the record.
type Member struct {
	// ID is the server id (the Raft ServerID): 1-128 bytes of UTF-8
	// without control characters.
	ID string `json:"id"`
	// Incarnation is the random id of the server's data directory: 0-64
	// bytes of printable ASCII (0x20-0x7E).
	Incarnation string `json:"incarnation"`
	// Removed makes the record a tombstone: the operator removed this
	// server (this incarnation of it).
	Removed bool `json:"removed"`
}

// Batch carries several commands in one log entry (group commit). Results
// come back in the same order.
type Batch struct{ Commands []Command }

// Type is TypeTick, TypeTickLimited when ExpireMax is set, or
// TypeTickPruned when PruneMax is.
func (c *Tick) Type() Type {
	switch {
	case c != nil && c.PruneMax > 0:
		return TypeTickPruned
	case c != nil && c.ExpireMax > 0:
		return TypeTickLimited
	}
	return TypeTick
}

func (*Acquire) Type() Type       { return TypeAcquire }
func (*Release) Type() Type       { return TypeRelease }
func (*Revoke) Type() Type        { return TypeRevoke }
func (*SessionCreate) Type() Type { return TypeSessionCreate }
func (*SessionEnd) Type() Type    { return TypeSessionEnd }
func (*ReleaseHolder) Type() Type { return TypeReleaseHolder }
func (*CancelWait) Type() Type    { return TypeCancelWait }
func (*Member) Type() Type        { return TypeMember }
func (*Batch) Type() Type         { return TypeBatch }

// Encode returns the log bytes of c: version (always Version), type, body.
// The body is the compact binary encoding described in codec.go.
func Encode(c Command) ([]byte, error) { return encodeBinary(c) }

// VersionChecked is the encoding version of entries that carry a checksum:
// a version-4 entry whose version byte is 5, followed by the CRC-32C
// (Castagnoli, little-endian) of every byte before it. Decode verifies it
// before it reads anything else, so that a bit flipped in the log (a disk
// that rots, a store that checks nothing) is an error naming the entry,
// never a different command applied. Every later version ends with the
// same checksum, so that a release can tell an entry of a newer version
// (ErrUnknownType) from damage.
const VersionChecked byte = 5

// EncodeChecked encodes c with a checksum (VersionChecked). Servers of
// earlier versions do not read it: the leader writes it only once every
// server of the configuration does.
func EncodeChecked(c Command) ([]byte, error) {
	b, err := encodeBinary(c)
	if err != nil {
		return nil, err
	}
	b[0] = VersionChecked
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// ErrChecksum is the error Decode wraps for an entry whose checksum does
// not match its bytes.
var ErrChecksum = errors.New("fsm: entry checksum mismatch (the entry's bytes changed after it was written)")

// ErrUnknownType is the error Decode wraps for a checked entry (its
// checksum holds), or a command in its batch, of a type after every type
// this release knows, or for an entry of a version after VersionChecked
// whose checksum holds: a newer release wrote it, once every server had
// announced the feature that brought it (and entry checksums before it).
// The server needs a newer binary; its log is not damaged. An unknown
// type or version without a checksum that holds is damage, not this error.
var ErrUnknownType = errors.New("fsm: entry type or version unknown to this release (written by a newer release)")

// VerifyChecksum checks the checksum of an entry of VersionChecked or a
// later version (ErrChecksum when it does not match its bytes: a version
// byte flipped upwards fails too); entries of earlier versions carry none
// and pass.
func VerifyChecksum(b []byte) error {
	if len(b) == 0 || b[0] < VersionChecked {
		return nil
	}
	if len(b) < 6 {
		return errors.New("fsm: checked entry shorter than its header and checksum")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return ErrChecksum
	}
	return nil
}

// Decode parses log bytes strictly: a known version and type, and a body
// that is exactly one valid encoding with nothing after it. Version 2 bodies
// are binary (codec.go); version 1 bodies are JSON, still read so that logs
// written before version 2 replay.
func Decode(b []byte) (Command, error) {
	if len(b) < 2 {
		return nil, errors.New("fsm: entry shorter than its header")
	}
	switch b[0] {
	case VersionChecked:
		if err := VerifyChecksum(b); err != nil && !canaryNoGuard {
			return nil, err
		}
		return decodeBinary(VersionChecked, Type(b[1]), b[2:len(b)-4]) // a version-4 body
	case versionBinary, versionQuota, versionBounds:
		return decodeBinary(b[0], Type(b[1]), b[2:])
	case versionJSON:
		return decodeJSON(Type(b[1]), b[2:])
	}
	if b[0] > VersionChecked && VerifyChecksum(b) == nil {
		return nil, fmt.Errorf("%w: version %d", ErrUnknownType, b[0])
	}
	return nil, fmt.Errorf("fsm: unknown command version %d", b[0])
}

// decodeJSON parses the body of a version-1 entry: JSON with no unknown
// fields, or for a Batch a sequence of uvarint-length-prefixed version-1
// entries. Empty maps and slices come back nil, as version 2 has them.
func decodeJSON(t Type, body []byte) (Command, error) {
	if t == TypeBatch {
		var batch Batch
		for len(body) > 0 {
			n, w := binary.Uvarint(body)
			if w <= 0 || n > uint64(len(body)-w) {
				return nil, errors.New("fsm: bad batch framing")
			}
			sub := body[w : w+int(n)]
			body = body[w+int(n):]
			if len(sub) < 2 {
				return nil, errors.New("fsm: entry shorter than its header")
			}
			if sub[0] != versionJSON {
				return nil, fmt.Errorf("fsm: version %d entry in a version %d batch", sub[0], versionJSON)
			}
			if Type(sub[1]) == TypeBatch {
				return nil, errors.New("fsm: nested batch")
			}
			if len(batch.Commands) == MaxBatch {
				return nil, errors.New("fsm: batch too large")
			}
			c, err := decodeJSON(Type(sub[1]), sub[2:])
			if err != nil {
				return nil, err
			}
			batch.Commands = append(batch.Commands, c)
		}
		if len(batch.Commands) == 0 {
			return nil, errors.New("fsm: empty batch")
		}
		return &batch, nil
	}
	c := newBody(versionJSON, t)
	if c == nil {
		return nil, fmt.Errorf("fsm: unknown command type %d", t)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, fmt.Errorf("fsm: decode %T: %w", c, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("fsm: trailing data after %T", c)
	}
	switch c := c.(type) {
	case *Acquire:
		c.Metadata = nilIfEmpty(c.Metadata)
		if len(c.SealedToken) == 0 {
			c.SealedToken = nil
		}
	case *Heartbeat:
		if len(c.Items) == 0 {
			c.Items = nil
		}
		for _, it := range c.Items {
			if it.SetMetadata || it.Metadata != nil {
				return nil, fmt.Errorf("fsm: decode %T: version 1 predates heartbeat metadata", c)
			}
		}
	case *SessionHeartbeat:
		if c.SetMetadata || c.Metadata != nil {
			return nil, fmt.Errorf("fsm: decode %T: version 1 predates session heartbeat metadata", c)
		}
	case *Renew:
		if c.SetMetadata || c.Metadata != nil {
			return nil, fmt.Errorf("fsm: decode %T: version 1 predates renew metadata", c)
		}
	case *SessionCreate:
		c.Metadata = nilIfEmpty(c.Metadata)
	case *Tick:
		if c.PruneMax != 0 {
			return nil, fmt.Errorf("fsm: decode %T: version 1 predates the prune limit", c)
		}
	}
	return c, nil
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
