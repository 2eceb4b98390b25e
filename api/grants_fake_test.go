package api

import (
	"context"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// The fake node's grant methods (fake_test.go has the rest).

func (f *fakeNode) LeaseGrant(_ context.Context, req wire.GrantRequest, stale bool) (*wire.Lease, error) {
	if err := f.record("LeaseGrant", req, stale); err != nil {
		return nil, err
	}
	l := testLease(req.LeaseID)
	l.Grant = "h.p.s"
	return l, nil
}

func (f *fakeNode) GrantKeys(_ context.Context, stale bool) (*grant.KeySet, error) {
	if err := f.record("GrantKeys", stale); err != nil {
		return nil, err
	}
	return &grant.KeySet{ClusterID: "c-1", Keys: []grant.JWK{grant.PublicJWK(make([]byte, 32))}}, nil
}
