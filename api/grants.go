package api

import (
	"net/http"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// Grants: an acquire or a renewal with "grant": true, and a GET of a lease
// by its holder (with X-Lease-Token, or X-Session-Token for a bound lease),
// answer the lease with a grant signed by the answering server (package
// grant); GET /v1/keys serves the key set that verifies them.

// keys handles GET /v1/keys[?stale=true]: the cluster's key set, a JWK Set.
// It needs no token: the keys are public, and a resource that verifies
// grants needs nothing else from the cluster.
func (s *leaseAPI) keys(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	stale := q.stale()
	if err := q.check(); err != nil {
		return err
	}
	ks, err := s.n.GrantKeys(r.Context(), stale)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ks)
	return nil
}

// getLeaseGrant answers GET /v1/leases/:id for the lease's holder: the
// lease with a grant, or LEASE_TOKEN_INVALID for a wrong token (and the
// state's code for an ended lease).
func (s *leaseAPI) getLeaseGrant(w http.ResponseWriter, r *http.Request, req wire.GrantRequest, stale bool) error {
	lease, err := s.n.LeaseGrant(r.Context(), req, stale)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, lease)
	return nil
}
