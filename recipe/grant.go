package recipe

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// GrantBackend is a Backend that also reads a lease with a grant of it: a
// JWS signed by the cluster naming the key, the holder and the fencing
// token, which a resource verifies offline (client.FenceGuard.CheckGrant,
// package grant). *client.Client and embedded.New's backend have it.
type GrantBackend interface {
	Backend
	// LeaseGrant reads a lease as its holder, with a grant of it.
	LeaseGrant(ctx context.Context, req wire.GrantRequest) (*wire.Lease, error)
}

var _ GrantBackend = (*client.Client)(nil)

// ErrNoGrants is returned by Grant when the session's Backend is not a
// GrantBackend.
var ErrNoGrants = errors.New("recipe: the backend gives no grants (it is not a GrantBackend)")

// grant returns a grant of the held lease, fresh from the server (its time
// claims start now).
func (l *locker) grant(ctx context.Context) (string, error) {
	l.mu.Lock()
	lease, h := l.lease, l.cur
	l.mu.Unlock()
	if lease == nil {
		return "", ErrNotHeld
	}
	if err := h.reason(); err != nil {
		return "", err
	}
	gb, ok := l.s.b.(GrantBackend)
	if !ok {
		return "", ErrNoGrants
	}
	g, err := gb.LeaseGrant(ctx, wire.GrantRequest{LeaseID: lease.LeaseID, Token: lease.Token})
	if err != nil {
		if lost := h.reason(); lost != nil {
			return "", lost
		}
		return "", err
	}
	return g.Grant, nil
}

// Grant returns a grant of the lock's lease, signed by the server that
// answers: pass it to the guarded resource instead of the bare Token, so
// that it can check that the fencing token is the cluster's. Its expiry
// estimate is the session's remaining time: ask again for a fresh one
// rather than keeping it. ErrNotHeld without the lock, LostErr's error
// once it is lost, ErrNoGrants on a Backend without grants.
func (m *Mutex) Grant(ctx context.Context) (string, error) { return m.l.grant(ctx) }

// Grant returns a grant of the slot's lease (its limit names the
// semaphore's size); see Mutex.Grant.
func (s *Semaphore) Grant(ctx context.Context) (string, error) { return s.l.grant(ctx) }

// Grant returns a grant of the leader's lease; see Mutex.Grant.
func (e *Election) Grant(ctx context.Context) (string, error) { return e.l.grant(ctx) }
