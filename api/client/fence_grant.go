package client

import (
	"context"

	"github.com/leasehold/leasehold/wire/grant"
)

// GrantVerifier verifies grants: *grant.Verifier (Client.GrantVerifier, or
// grant.NewVerifier over a key set read from a file).
type GrantVerifier interface {
	Verify(ctx context.Context, grant string) (*grant.Claims, error)
}

// CheckGrant is Check for a holder that shows a grant instead of a bare
// fencing token: the grant must verify (v), which proves that the cluster
// issued the fencing token it names for its key, so that a buggy or hostile
// client cannot raise the highest token seen at will; then its fencing
// token is checked as Check does, and recorded. It returns the grant's
// claims when both pass; a grant that does not verify records nothing.
//
// An exclusive lease's grant (limit 1) is fenced per key, as Check does.
// A semaphore slot's grant (limit N > 1) cannot be: N holders hold slots at
// once, each with its own token, and the slots are not numbered. It is
// fenced per key and holder (a holder's earlier leases on the key are
// refused once a later one was shown) and against the key's exclusive
// grants (any token below the highest exclusive grant seen for the key is
// refused). An exclusive grant must be at least every token seen for the
// key, slots included.
func (g *FenceGuard) CheckGrant(ctx context.Context, v GrantVerifier, token string) (*grant.Claims, error) {
	c, err := v.Verify(ctx, token)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// Entries: the key (every token seen for it), the key's exclusive
	// grants (key NUL), a holder's slots (key NUL holder). Keys and
	// holders have no control characters, so these never collide with a
	// key of Check.
	all, excl, mine := c.Key, c.Key+"\x00", c.Key+"\x00"+c.Holder
	if c.Limit <= 1 {
		if h := g.highest(all); c.FencingToken < h {
			return nil, &StaleTokenError{Key: c.Key, Token: c.FencingToken, Highest: h}
		}
		g.entry(all).highest = c.FencingToken
		g.entry(excl).highest = c.FencingToken
		return c, nil
	}
	if h := max(g.highest(excl), g.highest(mine)); c.FencingToken < h {
		return nil, &StaleTokenError{Key: c.Key, Token: c.FencingToken, Highest: h}
	}
	g.entry(mine).highest = c.FencingToken
	e := g.entry(all)
	e.highest = max(e.highest, c.FencingToken)
	return c, nil
}

// highest is the highest token seen for key, or the floor; g.mu is held.
func (g *FenceGuard) highest(key string) uint64 {
	if el, ok := g.keys[key]; ok {
		return el.Value.(*fenceEntry).highest
	}
	return g.floor
}
