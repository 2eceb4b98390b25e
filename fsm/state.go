package fsm

import (
	"fmt"

	"github.com/leasehold/leasehold/wire"
)

// GraceTicks is how many ticks past its nominal end a lease or session is
// actually expired. A grant applied just before a tick boundary and a tick
// whose proposal waited for the previous one to apply each cost up to one
// tick of real time; two ticks of grace make "never before TTL of real time
// since the request was sent" hold (DESIGN.md derives it).
const GraceTicks = 2

// State of a lease or a session. It takes one byte of a record (a million
// leases live in memory); its text (String, JSON) is its name.
type State uint8

// Lease states. Terminal states are final.
const (
	StateActive State = iota + 1
	StateReleased
	StateExpired
	StateRevoked
	stateEnded
)

// Session states. Terminal states are final.
const (
	SessionActive  = StateActive
	SessionEnded   = stateEnded
	SessionExpired = StateExpired
)

var stateNames = [...]string{"", "active", "released", "expired", "revoked", "ended"}

// String is the state's name ("" for the zero State).
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(" + itoa(uint64(s)) + ")"
}

// ParseState returns the state named name ("" gives the zero State) and
// whether there is one.
func ParseState(name string) (State, bool) {
	for i, n := range stateNames {
		if n == name {
			return State(i), true
		}
	}
	return 0, false
}

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) {
	if int(s) >= len(stateNames) {
		return nil, fmt.Errorf("fsm: no state %d", uint8(s))
	}
	return []byte(stateNames[s]), nil
}

// UnmarshalText reads a state's name.
func (s *State) UnmarshalText(b []byte) error {
	st, ok := ParseState(string(b))
	if !ok {
		return fmt.Errorf("fsm: unknown state %q", b)
	}
	*s = st
	return nil
}

// End reasons set by the state machine itself.
const (
	ReasonExpired        = "expired"
	ReasonSessionEnded   = "session_ended"
	ReasonHolderReleased = "holder_released"
	ReasonRevoked        = "revoked"
	ReasonReleased       = "released"
)

// Lease is one lease record. Records are copy-on-write: a *Lease handed out
// by the state machine (in a result, an event or a query) is never modified
// afterwards, so it may be read without locks.
//
// Fields are ordered to pack well (a million leases live in memory): what
// only an idempotent acquire sets is behind one pointer.
type Lease struct {
	ID        string `json:"id"`
	Key       string `json:"key"`
	Holder    string `json:"holder"`
	SessionID string `json:"session_id,omitempty"`
	// Limit is at most MaxLimit; with State it fills what RenewalCount
	// leaves of 8 bytes (a Lease takes the 176-byte size class).
	Limit uint16 `json:"limit"`
	State State  `json:"state"`
	// RenewalCount counts renewals (saturating).
	RenewalCount uint32 `json:"renewal_count,omitempty"`
	Fence        uint64 `json:"fence"`
	TokenHash    Hash   `json:"token_hash"`
	TTLMS        int64  `json:"ttl_ms,omitempty"`
	TTLTicks     uint64 `json:"ttl_ticks,omitempty"`
	// ExpiresTick is the nominal end of a standalone lease (acquire or last
	// renewal tick + TTLTicks); it expires when the tick reaches
	// ExpiresTick+GraceTicks. Bound leases follow their session instead.
	ExpiresTick    uint64 `json:"expires_tick,omitempty"`
	AcquiredTick   uint64 `json:"acquired_tick"`
	AcquiredWallMS int64  `json:"acquired_wall_ms"`
	RenewedWallMS  int64  `json:"renewed_wall_ms,omitempty"`
	// cold is nil unless the lease has metadata, a lock-delay or has
	// ended; idem is nil unless it was acquired with an idempotency key,
	// a sealed token or in a group. An active lease with neither takes
	// the 192-byte size class (a million leases live in memory).
	cold *leaseCold
	idem *leaseIdem
}

// leaseCold holds what most active leases do not have. Copy-on-write like
// the Lease: a change makes a new one (Lease.setCold).
type leaseCold struct {
	metadata       map[string]string
	lockDelayTicks uint64
	endedTick      uint64
	endedWallMS    int64
	endReason      string
}

// Metadata is the lease's metadata (nil for none). The map is the
// record's: read it, never modify it.
func (l *Lease) Metadata() map[string]string {
	if l.cold == nil {
		return nil
	}
	return l.cold.metadata
}

// LockDelayTicks is how long the lease's slot stays blocked after it ends
// involuntarily, in ticks.
func (l *Lease) LockDelayTicks() uint64 {
	if l.cold == nil {
		return 0
	}
	return l.cold.lockDelayTicks
}

// EndedTick is the tick at which the lease ended (0 while active).
func (l *Lease) EndedTick() uint64 {
	if l.cold == nil {
		return 0
	}
	return l.cold.endedTick
}

// EndedWallMS is the leader's wall clock when the lease ended (0 while
// active).
func (l *Lease) EndedWallMS() int64 {
	if l.cold == nil {
		return 0
	}
	return l.cold.endedWallMS
}

// EndReason says why the lease ended ("" while active).
func (l *Lease) EndReason() string {
	if l.cold == nil {
		return ""
	}
	return l.cold.endReason
}

// setCold gives l (a new record, not yet shared) its own copy of the cold
// fields, changed by set.
func (l *Lease) setCold(set func(c *leaseCold)) {
	var c leaseCold
	if l.cold != nil {
		c = *l.cold
	}
	set(&c)
	l.cold = c.orNil()
}

// orNil returns a pointer to a copy of c, or nil when c is all zero.
func (c leaseCold) orNil() *leaseCold {
	if c.zero() {
		return nil
	}
	return &c
}

// zero reports whether c holds nothing.
func (c *leaseCold) zero() bool {
	return c.metadata == nil && c.lockDelayTicks == 0 && c.endedTick == 0 && c.endedWallMS == 0 && c.endReason == ""
}

// markEnded records l's end (l is a new record, not yet shared).
func (l *Lease) markEnded(state State, reason string, tick uint64, wallMS int64) {
	l.State = state
	l.setCold(func(c *leaseCold) { c.endReason, c.endedTick, c.endedWallMS = reason, tick, wallMS })
}

// endedCopy returns a new record of l, ended as markEnded records it. The
// record and its cold fields are made in one allocation where a copy and
// markEnded made two (an expiry storm makes one for each lease it ends).
func (l *Lease) endedCopy(state State, reason string, tick uint64, wallMS int64) *Lease {
	r := &endedLease{Lease: *l}
	if l.cold != nil {
		r.cold = *l.cold
	}
	r.State = state
	r.cold.endReason, r.cold.endedTick, r.cold.endedWallMS = reason, tick, wallMS
	r.Lease.cold = nil
	if !r.cold.zero() {
		r.Lease.cold = &r.cold
	}
	return &r.Lease
}

// endedLease is an ended lease's record and its cold fields (endedCopy).
type endedLease struct {
	Lease
	cold leaseCold
}

// newLeaseCold returns the cold fields of a new lease, nil for none.
func newLeaseCold(meta map[string]string, lockDelayTicks uint64) *leaseCold {
	return leaseCold{metadata: nilIfEmpty(meta), lockDelayTicks: lockDelayTicks}.orNil()
}

// leaseIdem identifies the idempotent acquire that created a lease, and
// the lease group it belongs to (group.go).
type leaseIdem struct {
	hash        Hash   // names (holder, session, idempotency key): Acquire.IdemHash
	fingerprint Hash   // of the request
	sealed      []byte // Acquire.SealedToken
	group       string // the lease group's id; "" for a lease of its own
}

func newLeaseIdem(hash, fingerprint Hash, sealed []byte) *leaseIdem {
	if hash.IsZero() && fingerprint.IsZero() && len(sealed) == 0 {
		return nil
	}
	return &leaseIdem{hash: hash, fingerprint: fingerprint, sealed: sealed}
}

// SealedToken is the lease's token sealed under a key derived from its
// idempotency key (Acquire.SealedToken); nil for none.
func (l *Lease) SealedToken() []byte {
	if l.idem == nil {
		return nil
	}
	return l.idem.sealed
}

// hasIdemHashes reports whether either idempotency hash is set.
func (l *Lease) hasIdemHashes() bool {
	return l.idem != nil && !(l.idem.hash.IsZero() && l.idem.fingerprint.IsZero())
}

// idemHash is the lease's idempotency hash, zero for none.
func (l *Lease) idemHash() Hash {
	if l.idem == nil {
		return Hash{}
	}
	return l.idem.hash
}

// fingerprint is the fingerprint of the request that created the lease.
func (l *Lease) fingerprint() Hash {
	if l.idem == nil {
		return Hash{}
	}
	return l.idem.fingerprint
}

// Terminal reports whether the lease has ended.
func (l *Lease) Terminal() bool { return l.State != StateActive }

// Session is one session record, copy-on-write like Lease.
type Session struct {
	ID             string            `json:"id"`
	Holder         string            `json:"holder"`
	State          State             `json:"state"`
	TokenHash      Hash              `json:"token_hash"`
	TTLMS          int64             `json:"ttl_ms"`
	TTLTicks       uint64            `json:"ttl_ticks"`
	ExpiresTick    uint64            `json:"expires_tick"`
	CreatedWallMS  int64             `json:"created_wall_ms"`
	LastHeartbeat  int64             `json:"last_heartbeat_wall_ms,omitempty"`
	HeartbeatCount uint64            `json:"heartbeat_count,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	// LeaseIDs are the ids of the active leases bound to the session; once
	// the session has ended, the ones that were active when it ended.
	LeaseIDs    []string `json:"lease_ids,omitempty"`
	EndedTick   uint64   `json:"ended_tick,omitempty"`
	EndedWallMS int64    `json:"ended_wall_ms,omitempty"`
	EndReason   string   `json:"end_reason,omitempty"`
}

// EventType names a change in the event stream.
type EventType string

// Event types of the contract.
const (
	EventAcquired         EventType = "acquired"
	EventRenewed          EventType = "renewed"
	EventReleased         EventType = "released"
	EventExpired          EventType = "expired"
	EventRevoked          EventType = "revoked"
	EventSessionCreated   EventType = "session_created"
	EventSessionHeartbeat EventType = "session_heartbeat"
	EventSessionEnded     EventType = "session_ended"
	EventLockDelayEnded   EventType = "lock_delay_ended"
)

// Event is one change. (Index, Seq) identifies it identically on every
// replica: Seq counts events within the entry at Index, from 0.
type Event struct {
	Index    uint64
	Seq      uint32
	Type     EventType
	Tick     uint64
	WallMS   int64
	Key      string
	Lease    *Lease
	Session  *Session
	Reason   string
	Previous string // on acquired: the lease that last held the slot and ended involuntarily
}

// Result is the outcome of one command. Err is a business failure (nothing
// changed); otherwise the fields the command calls for are set.
type Result struct {
	Err      *wire.Error
	Lease    *Lease
	Session  *Session
	Replayed bool // an idempotent acquire matched an earlier one
	Queued   bool // an acquire is waiting for a slot (wait_ms)
	Items    []ItemResult
	// Leases are a lease group's members, in key order (AcquireGroup,
	// RenewGroup, ReleaseGroup; a Revoke of a member: the whole group).
	Leases []*Lease
	Count  int // ReleaseHolder: how many leases and sessions ended
	// Restore is what a RestoreCommit did (nil for every other command,
	// and for a restore that changed nothing).
	Restore *RebaseStats
}

// ItemResult is the outcome for one lease of a bulk heartbeat.
type ItemResult struct {
	LeaseID string
	Lease   *Lease
	Err     *wire.Error
}

// Notice tells the proposer of a queued acquire how its wait ended: granted
// (Lease set) or not (Err set). For a queued lease group LeaseID is the
// group's id and Leases its members once granted.
type Notice struct {
	LeaseID string
	Lease   *Lease
	Leases  []*Lease
	Err     *wire.Error
}

func (l *Lease) tableName() string { return l.ID }
