package recipe

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// Backend is what the recipes need of a Leasehold cluster. *client.Client
// implements it; embedded.New adapts an embedded *node.Node.
type Backend interface {
	// Acquire asks for a lease; with WaitMS it queues for a slot.
	Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, error)
	// Release ends a lease.
	Release(ctx context.Context, req wire.ReleaseRequest) (*wire.Lease, error)
	// RenewWith renews a lease; with Metadata it replaces the lease's
	// metadata (of a lease bound to a session: only that).
	RenewWith(ctx context.Context, req wire.RenewRequest) (*wire.Lease, error)
	// List reads one page of leases.
	List(ctx context.Context, req wire.ListRequest) (*wire.LeaseList, error)
	// Watch streams events to fn until ctx ends or fn fails.
	Watch(ctx context.Context, opts client.WatchOptions, fn func(wire.Event) error) error
	// CreateSession creates a session and returns it with its token.
	CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error)
	// EndSession ends a session and every lease bound to it.
	EndSession(ctx context.Context, sessionID, token string) (*wire.Session, error)
	// KeepAliveSession keeps a session alive; s is the answer of the
	// request sent at sent.
	KeepAliveSession(ctx context.Context, s *wire.Session, sent time.Time, opts client.KeepAliveOptions) (*client.KeepAlive, error)
}

var _ Backend = (*client.Client)(nil)
