// Package embedded adapts a node embedded in the process (package node) to
// recipe.Backend, so that the recipes run without HTTP.
package embedded

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

// New returns n as a recipe.Backend. Writes go through n's own Raft: on a
// node that is not the leader they fail (NO_LEADER or UNAVAILABLE) and the
// recipes retry; embed a single node, or use the client against a cluster.
func New(n *node.Node) recipe.Backend { return backend{n} }

type backend struct{ n *node.Node }

func (b backend) Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, error) {
	l, _, err := b.n.Acquire(ctx, req)
	return l, err
}

func (b backend) Release(ctx context.Context, req wire.ReleaseRequest) (*wire.Lease, error) {
	return b.n.Release(ctx, req)
}

func (b backend) RenewWith(ctx context.Context, req wire.RenewRequest) (*wire.Lease, error) {
	return b.n.RenewWith(ctx, req)
}

func (b backend) List(ctx context.Context, req wire.ListRequest) (*wire.LeaseList, error) {
	return b.n.ListLeases(ctx, req, false)
}

func (b backend) CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error) {
	return b.n.CreateSession(ctx, req)
}

func (b backend) EndSession(ctx context.Context, id, token string) (*wire.Session, error) {
	return b.n.EndSession(ctx, id, token, token == "")
}

func (b backend) KeepAliveSession(ctx context.Context, s *wire.Session, sent time.Time, opts client.KeepAliveOptions) (*client.KeepAlive, error) {
	return client.KeepAliveWith(ctx, sessionRenewer{b.n, s.SessionID, s.Token}, client.SessionAsLease(s), sent, opts)
}

type sessionRenewer struct {
	n         *node.Node
	id, token string
}

func (r sessionRenewer) Renew(ctx context.Context, _ time.Duration) (*wire.Lease, error) {
	return client.SessionRenewal(r.n.SessionHeartbeat(ctx, r.id, r.token))
}

func (r sessionRenewer) Release(ctx context.Context, _ string) error {
	_, err := r.n.EndSession(ctx, r.id, r.token, false)
	return err
}

// Watch follows the node's event stream until ctx ends, fn fails, or the
// subscription ends (the node closed, or the subscriber fell so far behind
// that history was overwritten: EVENTS_COMPACTED).
func (b backend) Watch(ctx context.Context, opts client.WatchOptions, fn func(wire.Event) error) error {
	sub, err := b.n.Subscribe(ctx, wire.EventFilter{Key: opts.Key, Prefix: opts.Prefix, Holder: opts.Holder,
		After: opts.LastEventID, AfterIndex: opts.AfterIndex, FromStart: opts.FromStart})
	if err != nil {
		return err
	}
	defer sub.Close()
	for ev := range sub.Events() {
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sub.Err(); err != nil {
		return err
	}
	return errors.New("embedded: the event subscription ended (node closed)")
}
