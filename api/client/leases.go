package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Acquire asks for a lease (POST /v1/leases). The returned lease carries its
// secret Token. req.SessionToken is sent as X-Session-Token for a
// session-bound lease. req.IdempotencyKey is sent in the JSON body. With
// req.IdempotencyKey set the request may be sent
// to several nodes in turn; without it, only until one may have received it.
func (c *Client) Acquire(ctx context.Context, req wire.AcquireRequest) (*wire.Lease, error) {
	return fetch[wire.Lease](ctx, c, acquireCall("/v1/leases", req, req.SessionToken, req.WaitMS, req.IdempotencyKey != ""))
}

// acquireCall is the request of an acquire (of a lease or a lease group):
// POST body to path, the session token as X-Session-Token, waitMS on top of
// the timeout, and sent to several nodes in turn only with an idempotency
// key. The idempotency key travels in the body (idempotency_key), never in
// a header: proxies and access logs record headers.
func acquireCall(path string, body any, sessionToken string, waitMS int64, idempotent bool) call {
	cl := call{
		method: http.MethodPost,
		path:   path,
		body:   body,
		header: headers("X-Session-Token", sessionToken),
		extra:  time.Duration(waitMS) * time.Millisecond,
	}
	if idempotent {
		cl.retry = retrySafe
	}
	return cl
}

// Get reads one lease in any retained state (GET /v1/leases/:id).
func (c *Client) Get(ctx context.Context, leaseID string) (*wire.Lease, error) {
	return fetch[wire.Lease](ctx, c, call{method: http.MethodGet, path: "/v1/leases/" + escape(leaseID), retry: retrySafe, read: true})
}

// List reads one page of leases (GET /v1/leases). req.Limit is the page
// size; pass the returned Next as req.After for the next page.
func (c *Client) List(ctx context.Context, req wire.ListRequest) (*wire.LeaseList, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("key", req.Key)
	set("prefix", req.Prefix)
	set("holder", req.Holder)
	set("session_id", req.SessionID)
	set("state", req.State)
	set("after", req.After)
	if req.Limit > 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	return fetch[wire.LeaseList](ctx, c, call{method: http.MethodGet, path: "/v1/leases", query: q, retry: retrySafe, read: true})
}

// Renew renews a standalone lease with its lease token (POST
// /v1/leases/:id/renew). ttlMS > 0 changes the lease's TTL; 0 keeps it.
func (c *Client) Renew(ctx context.Context, leaseID, token string, ttlMS int64) (*wire.Lease, error) {
	return c.RenewWith(ctx, wire.RenewRequest{LeaseID: leaseID, Token: token, TTLMS: ttlMS})
}

// RenewWith is Renew with all its options: req.Metadata, if not nil,
// replaces the lease's metadata with the renewal (an empty map clears it;
// at most 16 entries, 4 KiB in all), as a fleet worker reporting its
// processing statistics does. A lease bound to a session takes a renewal
// only with Metadata (and no TTL), which changes its metadata alone.
// req.Grant asks for a grant of the renewed lease in the answer (Grant).
func (c *Client) RenewWith(ctx context.Context, req wire.RenewRequest) (*wire.Lease, error) {
	var body any
	if req.TTLMS > 0 || req.Metadata != nil || req.Grant {
		body = struct {
			TTLMS    int64             `json:"ttl_ms,omitempty"`
			Metadata map[string]string `json:"metadata,omitzero"`
			Grant    bool              `json:"grant,omitempty"`
		}{req.TTLMS, req.Metadata, req.Grant}
	}
	return doNew[wire.Lease](ctx, c, call{
		method: http.MethodPost,
		path:   "/v1/leases/" + escape(req.LeaseID) + "/renew",
		body:   body,
		header: headers("X-Lease-Token", req.Token),
	})
}

// Release ends a lease (DELETE /v1/leases/:id) with its lease token or, for
// a session-bound lease, the session token. It returns the lease as the
// server reports it after the release (nil if the server sends no body).
func (c *Client) Release(ctx context.Context, req wire.ReleaseRequest) (*wire.Lease, error) {
	return release[wire.Lease](ctx, c, "/v1/leases/"+escape(req.LeaseID), req.Token, req.SessionToken, req.Reason)
}

// release sends DELETE path with the lease's (or group's) token or the
// session's, and the reason if any; the answer is nil when the server
// sends no body.
func release[T any](ctx context.Context, c *Client, path, token, sessionToken, reason string) (*T, error) {
	var body any
	if reason != "" {
		body = reasonBody{reason}
	}
	var v *T
	err := c.do(ctx, call{
		method: http.MethodDelete,
		path:   path,
		body:   body,
		header: headers("X-Lease-Token", token, "X-Session-Token", sessionToken),
	}, &v)
	return v, err
}

// Revoke force-ends a lease as an operator (POST /v1/leases/:id/revoke,
// admin scope).
func (c *Client) Revoke(ctx context.Context, leaseID, reason string) (*wire.Lease, error) {
	var l *wire.Lease
	err := c.do(ctx, call{
		method: http.MethodPost,
		path:   "/v1/leases/" + escape(leaseID) + "/revoke",
		body:   reasonBody{reason},
		admin:  true,
	}, &l)
	return l, err
}

type reasonBody struct {
	Reason string `json:"reason,omitempty"`
}

// Heartbeat renews many standalone leases at once (POST /v1/heartbeat). The
// error is about the request as a whole; each item's outcome is in its
// result. An item's Metadata, if not nil, replaces that lease's metadata
// with the renewal (see RenewWith).
func (c *Client) Heartbeat(ctx context.Context, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error) {
	if items == nil {
		items = []wire.HeartbeatItem{}
	}
	body := struct {
		Leases []wire.HeartbeatItem `json:"leases"`
	}{items}
	var raw json.RawMessage
	if err := c.do(ctx, call{method: http.MethodPost, path: "/v1/heartbeat", body: body}, &raw); err != nil {
		return nil, err
	}
	return decodeResults(raw)
}

// decodeResults accepts {"results": [...]} or a bare array.
func decodeResults(raw json.RawMessage) ([]wire.HeartbeatResult, error) {
	var res []wire.HeartbeatResult
	if len(raw) == 0 {
		return nil, errors.New("client: empty heartbeat response")
	}
	if raw[0] == '[' {
		if err := json.Unmarshal(raw, &res); err != nil {
			return nil, errors.New("client: decode heartbeat response: " + err.Error())
		}
		return res, nil
	}
	var obj struct {
		Results []wire.HeartbeatResult `json:"results"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, errors.New("client: decode heartbeat response: " + err.Error())
	}
	return obj.Results, nil
}

// Validate asks whether a fencing token (with Key) or a lease token (with
// LeaseID) is currently valid (POST /v1/validate). It changes nothing, so it
// is retried on other nodes like a read.
func (c *Client) Validate(ctx context.Context, req wire.ValidateRequest) (*wire.ValidateResult, error) {
	return fetch[wire.ValidateResult](ctx, c, call{method: http.MethodPost, path: "/v1/validate", body: req, retry: retrySafe})
}

// ReleaseHolderResult is the answer of POST /v1/holders/:holder/release.
type ReleaseHolderResult struct {
	Holder string `json:"holder"`
	// Released counts the leases and sessions that were ended.
	Released int `json:"released"`
}

// ReleaseHolder ends every lease and session of a holder (admin scope, or
// a write token scoped to that holder).
func (c *Client) ReleaseHolder(ctx context.Context, holder, reason string) (*ReleaseHolderResult, error) {
	return doNew[ReleaseHolderResult](ctx, c, call{
		method: http.MethodPost,
		path:   "/v1/holders/" + escape(holder) + "/release",
		body:   reasonBody{reason},
		admin:  true,
	})
}
