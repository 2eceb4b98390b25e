package client

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// Keys reads the cluster's key set (GET /v1/keys): the public keys that
// verify grants. It needs no token.
func (c *Client) Keys(ctx context.Context) (*grant.KeySet, error) {
	var raw json.RawMessage
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/keys", retry: retrySafe, read: true}, &raw); err != nil {
		return nil, err
	}
	return grant.ParseKeySet(raw)
}

// LeaseGrant reads a lease as its holder, with a grant of it signed by the
// server that answers (GET /v1/leases/:id with X-Lease-Token, or
// X-Session-Token for a lease bound to a session). Only an active lease
// gets one. With Options.StaleReads the contacted node answers and signs
// from its own state.
func (c *Client) LeaseGrant(ctx context.Context, req wire.GrantRequest) (*wire.Lease, error) {
	return doNew[wire.Lease](ctx, c, call{method: http.MethodGet, path: "/v1/leases/" + escape(req.LeaseID), retry: retrySafe, read: true,
		header: headers("X-Lease-Token", req.Token, "X-Session-Token", req.SessionToken)})
}

// GrantVerifier returns a verifier of grants against the cluster's key set,
// which it fetches with Keys when it first needs it, again after
// opts.MaxAge, and when a grant names a key it lacks (at most once per
// opts.MinRefetch); when the cluster cannot be reached it verifies with the
// set it has. See package grant.
func (c *Client) GrantVerifier(opts grant.VerifierOptions) *grant.Verifier {
	return grant.NewVerifier(c.Keys, opts)
}
