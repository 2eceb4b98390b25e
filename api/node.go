package api

import (
	"context"
	"io"

	"github.com/leasehold/leasehold/node"
)

// Node is what the HTTP API needs from an embedded node. *node.Node provides
// every method but Subscribe, whose result it returns as a concrete type; see
// Subscription. Errors should be *node.Error values (possibly wrapped); any
// other error is answered as 500 INTERNAL, except context errors, which are
// answered as 504 INDETERMINATE.
type Node interface {
	// Acquire grants a lease (replayed reports an idempotent replay). The
	// returned lease carries its secret Token.
	Acquire(ctx context.Context, req node.AcquireRequest) (lease *node.Lease, replayed bool, err error)
	GetLease(ctx context.Context, id string, stale bool) (*node.Lease, error)
	ListLeases(ctx context.Context, req node.ListRequest, stale bool) (*node.LeaseList, error)
	// Renew renews a standalone lease; ttlMS 0 keeps its TTL.
	Renew(ctx context.Context, id, token string, ttlMS int64) (*node.Lease, error)
	Release(ctx context.Context, req node.ReleaseRequest) (*node.Lease, error)
	Revoke(ctx context.Context, id, reason string) (*node.Lease, error)
	Heartbeat(ctx context.Context, items []node.HeartbeatItem) ([]node.HeartbeatResult, error)

	CreateSession(ctx context.Context, req node.SessionRequest) (*node.Session, error)
	GetSession(ctx context.Context, id string, stale bool) (*node.Session, error)
	ListSessions(ctx context.Context, holder, after string, limit int, stale bool) (*node.SessionList, error)
	SessionHeartbeat(ctx context.Context, id, token string) (*node.Session, error)
	// EndSession ends a session; force ends it without its token (admin).
	EndSession(ctx context.Context, id, token string, force bool) (*node.Session, error)
	// ReleaseHolder ends every lease and session of holder and reports how
	// many leases and sessions it ended.
	ReleaseHolder(ctx context.Context, holder, reason string) (int, error)
	Validate(ctx context.Context, req node.ValidateRequest) (*node.ValidateResult, error)

	// Subscribe starts an event subscription. An error with code
	// EVENTS_COMPACTED means the history no longer reaches back to the
	// requested position.
	Subscribe(ctx context.Context, filter node.EventFilter) (Subscription, error)

	// ClusterStatus is the cluster as this node sees it: linearizable
	// (leader only) unless stale.
	ClusterStatus(ctx context.Context, stale bool) (*node.ClusterStatus, error)
	RemoveMember(ctx context.Context, id string) error
	// TransferLeadership hands leadership to id, or to any voter if id is "".
	TransferLeadership(ctx context.Context, id string) error
	// SaveSnapshot writes a snapshot file of the whole state to w (leader
	// only); an error after the first write leaves a partial file.
	SaveSnapshot(ctx context.Context, w io.Writer) (*node.SnapshotInfo, error)
	// RestoreSnapshot verifies the snapshot file read from r, then replaces
	// the cluster state with it (leader only).
	RestoreSnapshot(ctx context.Context, r io.Reader) (*node.SnapshotInfo, error)

	// ReadyErr is nil when a leader is known and this node has applied up to
	// it; otherwise it says why not.
	ReadyErr() error
	// AppliedIndex is the node's last applied Raft index.
	AppliedIndex() uint64
	// Stats are the counters behind /metrics.
	Stats() node.Stats
}

// Subscription is an event subscription as the API consumes it. Events is
// closed when the subscription ends; Err then says why (nil after Close or
// when the node shut down cleanly). Close may be called more than once and
// concurrently with Events being drained.
type Subscription interface {
	Events() <-chan node.Event
	Err() error
	Close()
}

// FromNode adapts an embedded *node.Node to Node, so an application serves
// it with api.New(api.FromNode(n), opts).
func FromNode(n *node.Node) Node { return nodeAdapter{n} }

type nodeAdapter struct{ *node.Node }

func (a nodeAdapter) Subscribe(ctx context.Context, f node.EventFilter) (Subscription, error) {
	s, err := a.Node.Subscribe(ctx, f)
	if err != nil {
		return nil, err // not a nil *node.Subscription inside a non-nil interface
	}
	return s, nil
}
