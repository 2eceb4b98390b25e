package api

import (
	"context"
	"io"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
	"github.com/prometheus/client_golang/prometheus"
)

// Node is what the HTTP API needs from an embedded node; FromNode adapts a
// *node.Node. Every method is required: a node says what it cannot do (no
// leader known, no control lease) through its answers, so that nothing of
// the API is turned off by a method left out. Errors should be *wire.Error
// values (possibly wrapped); any other error is answered as 500 INTERNAL,
// except context errors, which are answered as 504 INDETERMINATE.
type Node interface {
	// Acquire grants a lease (replayed reports an idempotent replay). The
	// returned lease carries its secret Token.
	Acquire(ctx context.Context, req wire.AcquireRequest) (lease *wire.Lease, replayed bool, err error)
	GetLease(ctx context.Context, id string, stale bool) (*wire.Lease, error)
	// LeaseGrant reads a lease for its holder, who shows its token, with a
	// grant signed by this node (node.Node.LeaseGrant).
	LeaseGrant(ctx context.Context, req wire.GrantRequest, stale bool) (*wire.Lease, error)
	// GrantKeys is the cluster's key set, which verifies grants.
	GrantKeys(ctx context.Context, stale bool) (*grant.KeySet, error)
	ListLeases(ctx context.Context, req wire.ListRequest, stale bool) (*wire.LeaseList, error)
	// Renew renews a lease: TTLMS 0 keeps its TTL; Metadata, if not nil,
	// replaces its metadata (node.Node.RenewWith).
	Renew(ctx context.Context, req wire.RenewRequest) (*wire.Lease, error)
	// RenewMany renews each of reqs as Renew does, answering each in out
	// (as long as reqs): those not refused first are committed together,
	// in one log entry (node.Node.RenewMany).
	RenewMany(ctx context.Context, reqs []wire.RenewRequest, out []node.Renewed)
	Release(ctx context.Context, req wire.ReleaseRequest) (*wire.Lease, error)
	Revoke(ctx context.Context, id, reason string) (*wire.Lease, error)
	Heartbeat(ctx context.Context, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error)
	// AcquireGroup, GetGroup, RenewGroup and ReleaseGroup serve lease
	// groups (node.Node's).
	AcquireGroup(ctx context.Context, req wire.GroupAcquireRequest) (group *wire.LeaseGroup, replayed bool, err error)
	GetGroup(ctx context.Context, id string, stale bool) (*wire.LeaseGroup, error)
	RenewGroup(ctx context.Context, req wire.GroupRenewRequest) (*wire.LeaseGroup, error)
	ReleaseGroup(ctx context.Context, req wire.GroupReleaseRequest) (*wire.LeaseGroup, error)

	CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error)
	GetSession(ctx context.Context, id string, stale bool) (*wire.Session, error)
	ListSessions(ctx context.Context, holder, after string, limit int, stale bool) (*wire.SessionList, error)
	// SessionHeartbeat renews a session; Metadata, if not nil, replaces
	// its metadata (node.Node.SessionHeartbeatWith).
	SessionHeartbeat(ctx context.Context, req wire.SessionHeartbeatRequest) (*wire.Session, error)
	// EndSession ends a session; force ends it without its token (admin).
	EndSession(ctx context.Context, id, token string, force bool) (*wire.Session, error)
	// ReleaseHolder ends every lease and session of holder and reports how
	// many leases and sessions it ended.
	ReleaseHolder(ctx context.Context, holder, reason string) (int, error)
	Validate(ctx context.Context, req wire.ValidateRequest) (*wire.ValidateResult, error)

	// Subscribe starts an event subscription. An error with code
	// EVENTS_COMPACTED means the history no longer reaches back to the
	// requested position.
	Subscribe(ctx context.Context, filter wire.EventFilter) (Subscription, error)

	// ClusterStatus is the cluster as this node sees it: linearizable
	// (leader only) unless stale.
	ClusterStatus(ctx context.Context, stale bool) (*wire.ClusterStatus, error)
	RemoveMember(ctx context.Context, id string) error
	// TransferLeadership hands leadership to id, or to any voter if id is "".
	TransferLeadership(ctx context.Context, id string) error
	// SaveSnapshot writes a snapshot file of the whole state to w (leader
	// only); an error after the first write leaves a partial file.
	SaveSnapshot(ctx context.Context, w io.Writer) (*node.SnapshotInfo, error)
	// RestoreSnapshotWith verifies the snapshot file read from r, then
	// replaces the cluster state with it (leader only).
	RestoreSnapshotWith(ctx context.Context, r io.Reader, opts wire.RestoreOptions) (*node.SnapshotInfo, error)

	// ReadyErr is nil when a leader is known and this node has applied up to
	// it; otherwise it says why not.
	ReadyErr() error
	// AppliedIndex is the node's last applied Raft index.
	AppliedIndex() uint64
	// Stats are the counters behind /metrics.
	Stats() node.Stats
	// Registry is the node's own Prometheus registry, which /metrics
	// serves beside the API's; nil: none.
	Registry() *prometheus.Registry
	// HealthErr is nil while the node can do its work; otherwise it says
	// why not (*node.Node: its Raft log cannot be written), and /healthz
	// answers 503 UNAVAILABLE with it.
	HealthErr() error
	// LocalState is this node's own view (GET /v1/cluster/local); with
	// hashAt > 0, the hash of its state right after it applied that index.
	LocalState(ctx context.Context, hashAt uint64) (*node.LocalState, error)

	// Locator names the leader, to which a follower forwards requests.
	Locator
	// ControlLease is the node's control lease, served at /v1/control/
	// and gating the mutating admin routes; nil: the node has none (those
	// routes are not served and nothing is gated).
	ControlLease() ControlNode
}

// Locator places a node in its cluster.
type Locator interface {
	// Leader names the cluster's leader; ok is false when none is known
	// (or its HTTP address is not known yet). A follower forwards requests
	// to it (its HTTPAddr) and the control lease's operations (its
	// RaftAddr); a node that leads, or knows no leader, answers them
	// itself.
	Leader() (info node.LeaderInfo, ok bool)
	// NodeID is this node's id; it names the node in the requests it
	// forwards.
	NodeID() string
}

// Subscription is an event subscription as the API consumes it. Events is
// closed when the subscription ends; Err then says why (nil after Close or
// when the node shut down cleanly). Close may be called more than once and
// concurrently with Events being drained.
type Subscription interface {
	Events() <-chan wire.Event
	Err() error
	Close()
}

// FromNode adapts an embedded *node.Node to Node, so an application serves
// it with api.New(api.FromNode(n), opts). Its ControlLease is
// ControlFromNode(n).
func FromNode(n *node.Node) Node { return nodeAdapter{n} }

// ControlFromNode adapts an embedded *node.Node to ControlNode, for
// NewControl.
func ControlFromNode(n *node.Node) ControlNode { return nodeAdapter{n} }

// nodeAdapter is a *node.Node as Node and ControlNode.
type nodeAdapter struct{ *node.Node }

func (a nodeAdapter) ControlLease() ControlNode { return a }

func (a nodeAdapter) SessionHeartbeat(ctx context.Context, req wire.SessionHeartbeatRequest) (*wire.Session, error) {
	return a.Node.SessionHeartbeatWith(ctx, req)
}

func (a nodeAdapter) Renew(ctx context.Context, req wire.RenewRequest) (*wire.Lease, error) {
	return a.Node.RenewWith(ctx, req)
}

func (a nodeAdapter) Subscribe(ctx context.Context, f wire.EventFilter) (Subscription, error) {
	s, err := a.Node.Subscribe(ctx, f)
	if err != nil {
		return nil, err // not a nil *node.Subscription inside a non-nil interface
	}
	return s, nil
}
