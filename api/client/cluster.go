package client

import (
	"context"
	"net/http"

	"github.com/leasehold/leasehold/wire"
)

// Cluster reads the cluster's status as the leader sees it (a follower forwards the request; with Options.StaleReads, as the contacted node sees it) (GET
// /v1/cluster).
func (c *Client) Cluster(ctx context.Context) (*wire.ClusterStatus, error) {
	return fetch[wire.ClusterStatus](ctx, c, call{method: http.MethodGet, path: "/v1/cluster", retry: retrySafe, read: true})
}

// RemoveMember removes a server from the Raft configuration (DELETE
// /v1/cluster/members/:id, admin scope).
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: "/v1/cluster/members/" + escape(id), admin: true}, nil)
}

// TransferLeadership asks the leader to hand leadership over (POST
// /v1/cluster/transfer-leadership, admin scope): to the server named id, or
// to one the leader picks when id is empty.
func (c *Client) TransferLeadership(ctx context.Context, id string) error {
	body := struct {
		ID string `json:"id,omitempty"`
	}{id}
	return c.do(ctx, call{method: http.MethodPost, path: "/v1/cluster/transfer-leadership", body: body, admin: true}, nil)
}
