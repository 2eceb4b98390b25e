package wire

import "time"

// GroupKey is one key of a lease group: the key and its limit (0 or 1:
// exclusive; N > 1: a semaphore of N slots, as in AcquireRequest).
type GroupKey struct {
	Key   string `json:"key"`
	Limit uint32 `json:"limit,omitempty"`
}

// GroupAcquireRequest asks for a lease on each of several keys at once,
// all or nothing (POST /v1/groups): 1-64 distinct keys, each with its own
// limit; the other fields mean what they mean in AcquireRequest and apply
// to every key. WaitMS waits until every key can be granted at once.
type GroupAcquireRequest struct {
	Keys           []GroupKey        `json:"keys"`
	Holder         string            `json:"holder"`
	TTLMS          int64             `json:"ttl_ms,omitempty"`
	SessionID      string            `json:"session_id,omitempty"`
	SessionToken   string            `json:"-"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	WaitMS         int64             `json:"wait_ms,omitempty"`
	LockDelayMS    int64             `json:"lock_delay_ms,omitempty"`
}

// LeaseGroup is a lease group: one lease per key (Leases, in key order,
// each with its own fencing token and the group's id), granted together
// and ending together. State, TTLMS, RemainingMS, ExpiresAt and
// HeartbeatIntervalMS are the members' (they share them). Token is the
// group's secret token, which is also every member's lease token: set only
// in the response that granted the group (and on an idempotent replay).
type LeaseGroup struct {
	GroupID             string    `json:"group_id"`
	Holder              string    `json:"holder"`
	SessionID           string    `json:"session_id,omitempty"`
	State               string    `json:"state"`
	TTLMS               int64     `json:"ttl_ms"`
	RemainingMS         int64     `json:"remaining_ms"`
	ExpiresAt           time.Time `json:"expires_at"`
	HeartbeatIntervalMS int64     `json:"heartbeat_interval_ms"`
	Leases              []*Lease  `json:"leases"`
	Token               string    `json:"token,omitempty"`
}

// GroupRenewRequest renews every lease of a standalone lease group (POST
// /v1/groups/:id/renew). Token is the group's token; TTLMS, if not 0,
// becomes every member's TTL.
type GroupRenewRequest struct {
	GroupID string
	Token   string
	TTLMS   int64
}

// GroupReleaseRequest releases every lease of a lease group (DELETE
// /v1/groups/:id): Token is the group's token; for a group bound to a
// session SessionToken may be given instead.
type GroupReleaseRequest struct {
	GroupID      string
	Token        string
	SessionToken string
	Reason       string
}
