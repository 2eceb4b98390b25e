package recipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// DefaultSessionTTL is the TTL of a session when SessionOptions.TTL is 0.
const DefaultSessionTTL = 10 * time.Second

// ErrSessionLost is returned by a recipe asked to acquire on a session
// that is already lost or closed.
var ErrSessionLost = errors.New("recipe: session lost")

// SessionOptions configures NewSession.
type SessionOptions struct {
	// Holder names the holder of the session and of every lease on it.
	// Required.
	Holder string
	// TTL is the session's TTL; 0 means DefaultSessionTTL. The holder
	// learns of a loss at most TTL after the last successful heartbeat.
	TTL time.Duration
	// Metadata is stored on the session.
	Metadata map[string]string
	// KeepAlive tunes the heartbeat; the zero value is recommended.
	KeepAlive client.KeepAliveOptions
}

// Session is a server session kept alive by one keep-alive; every lease a
// recipe takes on it is bound to it. It is safe for concurrent use.
type Session struct {
	b     Backend
	s     *wire.Session
	ka    *client.KeepAlive
	owner string
	loss  losses
}

// NewSession creates a session and starts its heartbeat. ctx bounds the
// creation only; the session lives until Close or its loss.
func NewSession(ctx context.Context, b Backend, opts SessionOptions) (*Session, error) {
	opts.TTL = cmp.Or(opts.TTL, DefaultSessionTTL)
	sent := time.Now()
	s, err := b.CreateSession(ctx, wire.SessionRequest{Holder: opts.Holder, TTLMS: opts.TTL.Milliseconds(), Metadata: opts.Metadata})
	if err != nil {
		return nil, err
	}
	ka, err := b.KeepAliveSession(context.WithoutCancel(ctx), s, sent, opts.KeepAlive)
	if err != nil {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = b.EndSession(ectx, s.SessionID, s.Token)
		return nil, err
	}
	return &Session{b: b, s: s, ka: ka, owner: opts.Holder}, nil
}

// ID returns the session id.
func (s *Session) ID() string { return s.s.SessionID }

// Holder returns the holder name of the session and its leases.
func (s *Session) Holder() string { return s.owner }

// Done returns a channel that is closed when the session is lost or
// closed: at the latest a safety margin before the server could end it,
// counted from the send time of the last successful heartbeat. From then on
// no lease of the session may be relied on.
func (s *Session) Done() <-chan struct{} { return s.ka.Lost() }

// Err returns nil while the session is kept alive, then why Done closed
// (see client.KeepAlive.Err).
func (s *Session) Err() error { return s.ka.Err() }

// Context returns a context cancelled when Done closes: pass it to the
// work done under the session's leases.
func (s *Session) Context() context.Context { return s.ka.Context() }

// Deadline returns the instant Done closes unless a heartbeat succeeds
// before (monotonic clock).
func (s *Session) Deadline() time.Time { return s.ka.Deadline() }

// Close stops the heartbeat and ends the session on the server, which
// releases every lease on it.
func (s *Session) Close(ctx context.Context) error {
	err := s.ka.Release(ctx, "")
	if client.ErrorCode(err) == wire.CodeSessionEnded || client.ErrorCode(err) == wire.CodeSessionNotFound {
		return nil
	}
	return err
}

// Orphan stops the heartbeat without ending the session: it and its
// leases expire by themselves after the TTL.
func (s *Session) Orphan() { s.ka.Stop() }

// alive returns ErrSessionLost (wrapping the cause) once Done is closed.
func (s *Session) alive() error {
	select {
	case <-s.ka.Lost():
		return fmt.Errorf("%w: %w", ErrSessionLost, s.ka.Err())
	default:
		return nil
	}
}

// acquire asks for a lease bound to the session.
func (s *Session) acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, error) {
	req.SessionID, req.SessionToken, req.Holder = s.s.SessionID, s.s.Token, s.owner
	return s.b.Acquire(ctx, req)
}

// release gives a lease of the session back.
func (s *Session) release(ctx context.Context, l *wire.Lease) error {
	_, err := s.b.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, SessionToken: s.s.Token})
	return err
}

// KeepAlive returns the session's keep-alive (its LeaseID is the session
// id): Release on it is Close, Stop is Orphan.
func (s *Session) KeepAlive() *client.KeepAlive { return s.ka }
