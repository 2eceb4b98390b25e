package embedded

import (
	"context"

	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

var _ recipe.GrantBackend = backend{}

// LeaseGrant reads a lease as its holder with a grant signed by the node.
func (b backend) LeaseGrant(ctx context.Context, req wire.GrantRequest) (*wire.Lease, error) {
	return b.n.LeaseGrant(ctx, req, false)
}
