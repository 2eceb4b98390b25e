package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/leasehold/leasehold/wire"
)

// CreateSession creates a session (POST /v1/sessions). The returned session
// carries its secret Token, which binds leases to it and keeps it alive.
func (c *Client) CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error) {
	var s wire.Session
	if err := c.do(ctx, call{method: http.MethodPost, path: "/v1/sessions", body: req}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetSession reads one session (GET /v1/sessions/:id).
func (c *Client) GetSession(ctx context.Context, sessionID string) (*wire.Session, error) {
	var s wire.Session
	err := c.do(ctx, call{method: http.MethodGet, path: "/v1/sessions/" + escape(sessionID), retry: retrySafe, read: true}, &s)
	if err != nil {
		return nil, err
	}
	return &s, nil
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
	var out wire.SessionList
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/sessions", query: q, retry: retrySafe, read: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SessionHeartbeat renews a session and so every lease bound to it (POST
// /v1/sessions/:id/heartbeat, X-Session-Token).
func (c *Client) SessionHeartbeat(ctx context.Context, sessionID, token string) (*wire.Session, error) {
	var s wire.Session
	err := c.do(ctx, call{
		method: http.MethodPost,
		path:   "/v1/sessions/" + escape(sessionID) + "/heartbeat",
		header: headers("X-Session-Token", token),
	}, &s)
	if err != nil {
		return nil, err
	}
	return &s, nil
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
