package client

import (
	"context"
	"net/http"

	"github.com/leasehold/leasehold/wire"
)

// AcquireGroup takes a lease on each of several keys at once, all or
// nothing (POST /v1/groups): req.Keys lists 1-64 distinct keys, each with
// its own limit. The returned group carries its secret Token, which is
// also the lease token of every member, and the leases in key order, each
// with its own fencing token. A refusal changes nothing; LEASE_HELD names
// the first busy key and its holders (errors.As to *wire.Error). With
// req.WaitMS the group waits until every key can be granted to it.
// req.SessionToken is sent as X-Session-Token for a session-bound group;
// with req.IdempotencyKey set the request may be sent to several nodes in
// turn, as Acquire's.
func (c *Client) AcquireGroup(ctx context.Context, req wire.GroupAcquireRequest) (*wire.LeaseGroup, error) {
	return fetch[wire.LeaseGroup](ctx, c, acquireCall("/v1/groups", req, req.SessionToken, req.WaitMS, req.IdempotencyKey != ""))
}

// GetGroup reads a lease group in any retained state (GET /v1/groups/:id).
func (c *Client) GetGroup(ctx context.Context, groupID string) (*wire.LeaseGroup, error) {
	return fetch[wire.LeaseGroup](ctx, c, call{method: http.MethodGet, path: "/v1/groups/" + escape(groupID), retry: retrySafe, read: true})
}

// RenewGroup renews every lease of a standalone lease group with the
// group's token (POST /v1/groups/:id/renew). ttlMS > 0 changes their TTL;
// 0 keeps it.
func (c *Client) RenewGroup(ctx context.Context, groupID, token string, ttlMS int64) (*wire.LeaseGroup, error) {
	var body any
	if ttlMS > 0 {
		body = struct {
			TTLMS int64 `json:"ttl_ms"`
		}{ttlMS}
	}
	return doNew[wire.LeaseGroup](ctx, c, call{
		method: http.MethodPost,
		path:   "/v1/groups/" + escape(groupID) + "/renew",
		body:   body,
		header: headers("X-Lease-Token", token),
	})
}

// ReleaseGroup releases every lease of a lease group (DELETE
// /v1/groups/:id) with the group's token or, for a session-bound group,
// the session token.
func (c *Client) ReleaseGroup(ctx context.Context, req wire.GroupReleaseRequest) (*wire.LeaseGroup, error) {
	return release[wire.LeaseGroup](ctx, c, "/v1/groups/"+escape(req.GroupID), req.Token, req.SessionToken, req.Reason)
}
