package api

import (
	"context"

	"github.com/leasehold/leasehold/wire"
)

func testGroup(id string) *wire.LeaseGroup {
	a, b := testLease("ls_a"), testLease("ls_b")
	a.GroupID, b.GroupID, b.Key = id, id, "k2"
	return &wire.LeaseGroup{GroupID: id, Holder: "h", State: "active", TTLMS: 10000, RemainingMS: 9000,
		ExpiresAt: a.ExpiresAt, Leases: []*wire.Lease{a, b}}
}

func (f *fakeNode) AcquireGroup(_ context.Context, req wire.GroupAcquireRequest) (*wire.LeaseGroup, bool, error) {
	if err := f.record("AcquireGroup", req); err != nil {
		return nil, false, err
	}
	g := testGroup("lg_1")
	g.Token = "secret"
	return g, f.replayed, nil
}

func (f *fakeNode) GetGroup(_ context.Context, id string, stale bool) (*wire.LeaseGroup, error) {
	if err := f.record("GetGroup", id, stale); err != nil {
		return nil, err
	}
	return testGroup(id), nil
}

func (f *fakeNode) RenewGroup(_ context.Context, req wire.GroupRenewRequest) (*wire.LeaseGroup, error) {
	if err := f.record("RenewGroup", req); err != nil {
		return nil, err
	}
	return testGroup(req.GroupID), nil
}

func (f *fakeNode) ReleaseGroup(_ context.Context, req wire.GroupReleaseRequest) (*wire.LeaseGroup, error) {
	if err := f.record("ReleaseGroup", req); err != nil {
		return nil, err
	}
	return testGroup(req.GroupID), nil
}
