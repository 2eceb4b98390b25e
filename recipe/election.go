package recipe

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// ErrNoLeader is returned by Election.Leader when nobody leads.
var ErrNoLeader = errors.New("recipe: no leader elected")

// ValueKey is the metadata entry of an election lease that carries the
// leader's value.
const ValueKey = "value"

// Leader is an election's leader as the server reports it.
type Leader struct {
	Holder       string
	Value        string
	LeaseID      string
	FencingToken uint64
}

// Election elects one leader among the campaigners on one key: the leader
// is the holder of the key's lease (limit 1), bound to its session.
type Election struct {
	l locker
}

// NewElection returns an election on key for the session.
func NewElection(s *Session, key string) *Election {
	return &Election{locker{s: s, key: key, limit: 1}}
}

// Campaign waits, as long as ctx allows, to become the leader, announcing
// value (at most the server's metadata limits: 4 KiB). Campaigners are
// served first come first served.
func (e *Election) Campaign(ctx context.Context, value string) error {
	return e.l.lock(ctx, true, map[string]string{ValueKey: value})
}

// Proclaim changes the value the leader announces without giving
// leadership up (as etcd's Election.Proclaim does): one renewal of the
// election's lease replaces its value (the lease's metadata), and Leader
// and Observe report the new value. It fails with ErrNotHeld when this
// campaigner does not lead, with LostErr's error once the leadership is
// lost, and otherwise with the server's error (the value past the metadata
// limits, say: INVALID_ARGUMENT; or UNAVAILABLE while a server of the
// cluster runs a version without metadata renewals); the announced value
// is then the previous one, unless the error is INDETERMINATE.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	return e.l.setMeta(ctx, ValueKey, value)
}

// Resign gives leadership up, letting the next campaigner lead.
func (e *Election) Resign(ctx context.Context) error { return e.l.unlock(ctx) }

// IsLeader reports whether this campaigner holds the leadership, as far
// as it knows: false once Lost has closed.
func (e *Election) IsLeader() bool { return e.l.held() != nil && e.l.lostErr() == nil }

// Token returns the leader's fencing token, 0 when not the leader.
func (e *Election) Token() uint64 { return e.l.token() }

// Done is the session's Done: closed before the server could end this
// leadership by ending the session and elect someone else; see Lost for
// the leadership's own end.
func (e *Election) Done() <-chan struct{} { return e.l.s.Done() }

// Lost returns a channel closed when the leadership won by the last
// Campaign ends: its lease revoked by an operator or ended on the server,
// the session lost, or Resign (see Mutex.Lost).
func (e *Election) Lost() <-chan struct{} { return e.l.lost() }

// LostErr returns nil while leading, then why Lost closed (see
// Mutex.LostErr; ErrUnlocked after Resign).
func (e *Election) LostErr() error { return e.l.lostErr() }

// Key returns the election's key.
func (e *Election) Key() string { return e.l.key }

// Leader reads the current leader (linearizable), or ErrNoLeader.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	return leaderOf(ctx, e.l.s.b, e.l.key)
}

func leaderOf(ctx context.Context, b Backend, key string) (*Leader, error) {
	ls, err := b.List(ctx, wire.ListRequest{Key: key, State: "active", Limit: 10})
	if err != nil {
		return nil, err
	}
	for _, l := range ls.Leases {
		if l.Key == key && l.State == "active" {
			return &Leader{Holder: l.Holder, Value: l.Metadata[ValueKey], LeaseID: l.LeaseID, FencingToken: l.FencingToken}, nil
		}
	}
	return nil, ErrNoLeader
}

// Observe reports the leader of the election on key each time it changes,
// or its value does (Proclaim), starting with the current one; nil means
// nobody leads. It follows the
// event stream and reads the leader again after every event of the key,
// so it reports the current state and never an outdated one, though two
// quick changes may be reported as one. The channel closes when ctx ends
// (or the stream fails for good: a 4xx answer).
func Observe(ctx context.Context, b Backend, key string) <-chan *Leader {
	ch := make(chan *Leader)
	go func() {
		defer close(ch)
		var last *Leader
		first := true
		report := func() error {
			ld, err := leaderOf(ctx, b, key)
			backoff := newBackoff()
			for err != nil && !errors.Is(err, ErrNoLeader) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err := sleepCtx(ctx, backoff.Next()); err != nil {
					return err
				}
				ld, err = leaderOf(ctx, b, key)
			}
			if !first && sameLeader(ld, last) {
				return nil
			}
			first, last = false, ld
			select {
			case ch <- ld:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if report() != nil {
			return
		}
		// From the start of the kept history: an event between the read
		// above and the stream's opening is replayed rather than missed;
		// replayed events only cause a read of the current state.
		_ = b.Watch(ctx, client.WatchOptions{Key: key, FromStart: true, OnReconnect: func(error, time.Duration) {}}, func(ev wire.Event) error {
			switch ev.Type {
			case "acquired", "released", "expired", "revoked", "renewed":
				return report()
			}
			return nil
		})
	}()
	return ch
}

// Observe is Observe on this election's key.
func (e *Election) Observe(ctx context.Context) <-chan *Leader {
	return Observe(ctx, e.l.s.b, e.l.key)
}

func sameLeader(a, b *Leader) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.LeaseID == b.LeaseID && a.Value == b.Value
}
