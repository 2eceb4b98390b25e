package wire

import "time"

// Lease is the contract's lease object. Times are display estimates; the
// authoritative countdown is RemainingMS, derived from committed ticks.
type Lease struct {
	LeaseID             string            `json:"lease_id"`
	Key                 string            `json:"key"`
	Holder              string            `json:"holder"`
	Limit               uint32            `json:"limit"`
	SessionID           string            `json:"session_id,omitempty"`
	GroupID             string            `json:"group_id,omitempty"` // the lease group it is a member of (LeaseGroup)
	State               string            `json:"state"`
	FencingToken        uint64            `json:"fencing_token"`
	TTLMS               int64             `json:"ttl_ms"`
	RemainingMS         int64             `json:"remaining_ms"`
	ExpiresAt           time.Time         `json:"expires_at"`
	AcquiredAt          time.Time         `json:"acquired_at"`
	LastRenewedAt       *time.Time        `json:"last_renewed_at,omitempty"`
	EndedAt             *time.Time        `json:"ended_at,omitempty"`
	HeartbeatIntervalMS int64             `json:"heartbeat_interval_ms"`
	RenewalCount        uint32            `json:"renewal_count"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EndReason           string            `json:"end_reason,omitempty"`
	// Token is the secret lease token: set only in the response that
	// granted the lease (and on an idempotent replay of that request).
	Token string `json:"token,omitempty"`
	// Grant is a grant of the lease signed by the answering server (a
	// compact JWS, package grant): set only in an answer that asked for
	// one, and only while the lease is active.
	Grant string `json:"grant,omitempty"`
}

// Session is the contract's session object.
type Session struct {
	SessionID           string            `json:"session_id"`
	Holder              string            `json:"holder"`
	State               string            `json:"state"`
	TTLMS               int64             `json:"ttl_ms"`
	RemainingMS         int64             `json:"remaining_ms"`
	ExpiresAt           time.Time         `json:"expires_at"`
	HeartbeatIntervalMS int64             `json:"heartbeat_interval_ms"`
	LastHeartbeat       *time.Time        `json:"last_heartbeat,omitempty"`
	HeartbeatCount      uint64            `json:"heartbeat_count"`
	CreatedAt           time.Time         `json:"created_at"`
	EndedAt             *time.Time        `json:"ended_at,omitempty"`
	EndReason           string            `json:"end_reason,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	LeaseIDs            []string          `json:"lease_ids"`
	// Token is the secret session token: set only when the session is created.
	Token string `json:"token,omitempty"`
}

// AcquireRequest asks for a lease. Either TTLMS (a standalone lease) or
// SessionID with SessionToken (a lease bound to the session) is required.
type AcquireRequest struct {
	Key            string            `json:"key"`
	Holder         string            `json:"holder"`
	TTLMS          int64             `json:"ttl_ms,omitempty"`
	SessionID      string            `json:"session_id,omitempty"`
	SessionToken   string            `json:"-"`
	Limit          uint32            `json:"limit,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	WaitMS         int64             `json:"wait_ms,omitempty"`
	LockDelayMS    int64             `json:"lock_delay_ms,omitempty"`
	// Grant asks for a grant of the lease in the answer (Lease.Grant).
	Grant bool `json:"grant,omitempty"`
}

// ReleaseRequest ends a lease. Token is the lease token; for a bound lease
// SessionToken may be given instead.
type ReleaseRequest struct {
	LeaseID      string
	Token        string
	SessionToken string
	Reason       string
}

// HeartbeatItem names one lease of a bulk heartbeat. Metadata, if not nil,
// replaces the lease's metadata with the renewal (an empty map clears it;
// at most 16 entries, 4 KiB in all); nil leaves it as it is.
type HeartbeatItem struct {
	LeaseID  string            `json:"lease_id"`
	Token    string            `json:"token"`
	Metadata map[string]string `json:"metadata,omitzero"`
}

// RenewRequest renews a lease (POST /v1/leases/:id/renew). Token is the
// lease token. TTLMS, if not 0, becomes the lease's TTL. Metadata, if not
// nil, replaces the lease's metadata with the renewal (an empty map clears
// it; at most 16 entries, 4 KiB in all); nil leaves it as it is. A lease
// bound to a session is renewed by its session's heartbeat: a renewal of
// it must carry Metadata (and no TTL), and changes only its metadata.
type RenewRequest struct {
	LeaseID  string
	Token    string
	TTLMS    int64
	Metadata map[string]string
	// Grant asks for a grant of the renewed lease in the answer.
	Grant bool
}

// HeartbeatResult is the outcome for one lease of a bulk heartbeat: on
// success the lease's new countdown, otherwise Error. It is deliberately
// smaller than a Lease: a heartbeat may carry thousands of leases.
type HeartbeatResult struct {
	LeaseID      string     `json:"lease_id"`
	OK           bool       `json:"ok"`
	FencingToken uint64     `json:"fencing_token,omitempty"`
	RemainingMS  int64      `json:"remaining_ms,omitempty"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
	RenewalCount uint32     `json:"renewal_count,omitempty"`
	Error        *Error     `json:"error,omitempty"`
}

// KeepAliveRenewal is one line of a keep-alive stream (POST
// /v1/leases/keepalive): a renewal of one standalone lease, as POST
// /v1/leases/:id/renew does. ID is the client's own request id (at least 1),
// echoed in the answer; TTLMS, if not 0, is the lease's new TTL; Metadata,
// if not nil, replaces the lease's metadata (see RenewRequest).
type KeepAliveRenewal struct {
	ID       uint64            `json:"id"`
	LeaseID  string            `json:"lease_id"`
	Token    string            `json:"token"`
	TTLMS    int64             `json:"ttl_ms,omitempty"`
	Metadata map[string]string `json:"metadata,omitzero"`
}

// KeepAliveAnswer is one line of a keep-alive stream's answer: the outcome of
// the renewal with the same ID, written once its Raft entry is committed
// (OK), or Error with Status, the HTTP status the single renew would have
// answered. ID 0 answers a line that could not be read as a renewal.
type KeepAliveAnswer struct {
	ID           uint64     `json:"id"`
	LeaseID      string     `json:"lease_id,omitempty"`
	OK           bool       `json:"ok"`
	FencingToken uint64     `json:"fencing_token,omitempty"`
	TTLMS        int64      `json:"ttl_ms,omitempty"`
	RemainingMS  int64      `json:"remaining_ms,omitempty"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
	RenewalCount uint32     `json:"renewal_count,omitempty"`
	Status       int        `json:"status,omitempty"`
	Error        *Error     `json:"error,omitempty"`
}

// SessionRequest creates a session.
type SessionRequest struct {
	Holder   string            `json:"holder"`
	TTLMS    int64             `json:"ttl_ms"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SessionHeartbeatRequest is a session heartbeat (POST
// /v1/sessions/:id/heartbeat). Metadata, if not nil, replaces the
// session's metadata with the heartbeat (a worker's statistics); an empty
// non-nil map clears it.
type SessionHeartbeatRequest struct {
	SessionID string
	Token     string
	Metadata  map[string]string
}

// ListRequest filters a lease listing. Empty fields match everything.
type ListRequest struct {
	Key       string
	Prefix    string
	Holder    string
	SessionID string
	State     string
	After     string // cursor: the "next" of the previous page
	Limit     int    // page size; 0 means the default (100), at most 1000
}

// LeaseList is one page of a listing; Next is empty on the last page.
type LeaseList struct {
	Leases []*Lease `json:"leases"`
	Next   string   `json:"next,omitempty"`
}

// SessionList is one page of sessions.
type SessionList struct {
	Sessions []*Session `json:"sessions"`
	Next     string     `json:"next,omitempty"`
}

// ValidateRequest asks whether a fencing token (with Key) or a lease token
// (with LeaseID) is currently valid.
type ValidateRequest struct {
	Key          string `json:"key,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	LeaseID      string `json:"lease_id,omitempty"`
	Token        string `json:"token,omitempty"`
}

// ValidateResult answers a ValidateRequest. Current is the lease the answer
// is about (the active lease on the key, or the named lease), nil if none.
type ValidateResult struct {
	Valid   bool   `json:"valid"`
	Reason  string `json:"reason"`
	Current *Lease `json:"current"`
}

// Event is one change in the event stream. ID ("<index>-<seq>") orders
// events identically on every node and is what Last-Event-ID resumes from.
type Event struct {
	ID       string    `json:"id"`
	Index    uint64    `json:"index"`
	Type     string    `json:"type"`
	Tick     uint64    `json:"tick"`
	Time     time.Time `json:"time"`
	Key      string    `json:"key,omitempty"`
	Lease    *Lease    `json:"lease,omitempty"`
	Session  *Session  `json:"session,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Previous string    `json:"previous,omitempty"`
}

// EventFilter selects events. After resumes strictly after an event id
// ("<index>-<seq>", as in Last-Event-ID) or, with AfterIndex, after every
// event of that Raft index. Neither set: only new events.
type EventFilter struct {
	Key        string
	Prefix     string
	Holder     string
	After      string
	AfterIndex uint64
	FromStart  bool // with neither After nor AfterIndex: replay what history is kept
}

// Member is one server of the cluster.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
	// Voter: a voting member; false for a non-voter being caught up (and
	// for servers outside the configuration).
	Voter  bool `json:"voter"`
	Leader bool `json:"leader"`
	// Health: healthy (in contact with the leader and caught up), unhealthy,
	// failed (gossip cannot reach it), unknown; for a server gossip knows
	// but the configuration does not: joining, removed (its data directory
	// was removed from the cluster) or refused (not admitted: another
	// cluster's state, a wiped server under a member's id, or a server
	// that does not read a feature the cluster records).
	Health string `json:"health"`
	// Reason says why a refused server is not admitted, when the server
	// can tell (a feature it does not read: upgrade it).
	Reason string `json:"reason,omitempty"`
	// LastContact: when it last heard from the leader (the leader: now).
	LastContact *time.Time `json:"last_contact,omitempty"`
	// Gossip is the gossip view: alive, failed (unreachable, or left) or
	// unknown.
	Gossip  string `json:"gossip"`
	Version string `json:"version,omitempty"`
}

// ClusterStatus is the answer of GET /v1/cluster.
type ClusterStatus struct {
	NodeID        string   `json:"node_id"`
	Leader        string   `json:"leader"`
	LeaderAddr    string   `json:"leader_addr"`
	State         string   `json:"state"`
	Term          uint64   `json:"term"`
	CommitIndex   uint64   `json:"commit_index"`
	AppliedIndex  uint64   `json:"applied_index"`
	Tick          uint64   `json:"tick"`
	TickPeriodMS  int64    `json:"tick_period_ms"`
	Members       []Member `json:"members"`
	ActiveLeases  int      `json:"active_leases"`
	ActiveSession int      `json:"active_sessions"`
}
