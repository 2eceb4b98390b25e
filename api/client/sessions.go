package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// CreateSession creates a session (POST /v1/sessions). The returned session
// carries its secret Token, which binds leases to it and keeps it alive.
func (c *Client) CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error) {
	return fetch[wire.Session](ctx, c, call{method: http.MethodPost, path: "/v1/sessions", body: req})
}

// GetSession reads one session (GET /v1/sessions/:id).
func (c *Client) GetSession(ctx context.Context, sessionID string) (*wire.Session, error) {
	return fetch[wire.Session](ctx, c, call{method: http.MethodGet, path: "/v1/sessions/" + escape(sessionID), retry: retrySafe, read: true})
}

// ListSessions reads one page of sessions (GET /v1/sessions), optionally of
// one holder; after is the Next of the previous page.
func (c *Client) ListSessions(ctx context.Context, holder, after string) (*wire.SessionList, error) {
	q := url.Values{}
	if holder != "" {
		q.Set("holder", holder)
	}
	if after != "" {
		q.Set("after", after)
	}
	return fetch[wire.SessionList](ctx, c, call{method: http.MethodGet, path: "/v1/sessions", query: q, retry: retrySafe, read: true})
}

// SessionHeartbeat renews a session and so every lease bound to it (POST
// /v1/sessions/:id/heartbeat, X-Session-Token).
func (c *Client) SessionHeartbeat(ctx context.Context, sessionID, token string) (*wire.Session, error) {
	return doNew[wire.Session](ctx, c, call{
		method: http.MethodPost,
		path:   "/v1/sessions/" + escape(sessionID) + "/heartbeat",
		header: headers("X-Session-Token", token),
	})
}

// SessionHeartbeatWith is SessionHeartbeat with the request's Metadata: if
// not nil, it replaces the session's metadata with the heartbeat (a
// worker's statistics; an empty map clears it).
func (c *Client) SessionHeartbeatWith(ctx context.Context, req wire.SessionHeartbeatRequest) (*wire.Session, error) {
	var body any
	if req.Metadata != nil {
		body = struct {
			Metadata map[string]string `json:"metadata"`
		}{req.Metadata}
	}
	return doNew[wire.Session](ctx, c, call{
		method: http.MethodPost,
		path:   "/v1/sessions/" + escape(req.SessionID) + "/heartbeat",
		header: headers("X-Session-Token", req.Token),
		body:   body,
	})
}

// EndSession ends a session and all its leases (DELETE /v1/sessions/:id).
// With token empty no X-Session-Token is sent: an operator's forced end,
// which needs admin scope.
func (c *Client) EndSession(ctx context.Context, sessionID, token string) (*wire.Session, error) {
	var s *wire.Session
	err := c.do(ctx, call{
		method: http.MethodDelete,
		path:   "/v1/sessions/" + escape(sessionID),
		header: headers("X-Session-Token", token),
		admin:  token == "",
	}, &s)
	return s, err
}

// KeepAliveSession keeps a session alive (its heartbeat, and so every
// lease bound to it) with KeepAlive's deadline rule: s is the answer of
// the create or heartbeat sent at sent. Lost closes before the server could
// end the session and so grant any of its leases to someone else. Release
// ends the session (and its leases). The KeepAlive's LeaseID is the
// session id.
func (c *Client) KeepAliveSession(ctx context.Context, s *wire.Session, sent time.Time, opts KeepAliveOptions) (*KeepAlive, error) {
	if s == nil || s.SessionID == "" || s.Token == "" {
		return nil, errors.New("client: keep-alive needs a session with its id and token")
	}
	if s.State != "" && s.State != "active" {
		return nil, fmt.Errorf("client: keep-alive of a session that is %s", s.State)
	}
	return KeepAliveWith(ctx, sessionRenewer{c, s.SessionID, s.Token}, SessionAsLease(s), sent, opts)
}

// SessionAsLease describes a session as a KeepAlive (KeepAliveWith) reads
// the thing it keeps alive: its id, state and timing.
func SessionAsLease(s *wire.Session) *wire.Lease {
	return &wire.Lease{LeaseID: s.SessionID, Holder: s.Holder, State: s.State, TTLMS: s.TTLMS,
		RemainingMS: s.RemainingMS, HeartbeatIntervalMS: s.HeartbeatIntervalMS}
}

// SessionRenewal turns the answer of a session heartbeat into a Renewer's
// answer: a session no longer active is an error with code SESSION_ENDED.
func SessionRenewal(s *wire.Session, err error) (*wire.Lease, error) {
	if err != nil {
		return nil, err
	}
	if s.State != "" && s.State != "active" {
		return nil, &wire.Error{Code: wire.CodeSessionEnded, Message: fmt.Sprintf("session %s is %s", s.SessionID, s.State)}
	}
	return SessionAsLease(s), nil
}

type sessionRenewer struct {
	c         *Client
	id, token string
}

// Renew sends the heartbeat to the next address after a transport failure,
// an attempt that ran out of time, or a 503: a duplicate heartbeat only
// pushes the session's end later.
func (r sessionRenewer) Renew(ctx context.Context, attempt time.Duration) (*wire.Lease, error) {
	var s wire.Session
	err := r.c.do(ctx, call{
		method:  http.MethodPost,
		path:    "/v1/sessions/" + escape(r.id) + "/heartbeat",
		header:  headers("X-Session-Token", r.token),
		retry:   retrySafe,
		timeout: attempt,
	}, &s)
	return SessionRenewal(&s, err)
}

func (r sessionRenewer) Release(ctx context.Context, _ string) error {
	_, err := r.c.EndSession(ctx, r.id, r.token)
	return err
}
