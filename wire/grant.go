package wire

// GrantRequest asks for a lease with a grant of it (GET /v1/leases/:id with
// X-Lease-Token): the holder shows the lease's token, or, for a lease bound
// to a session, the session's (SessionToken).
type GrantRequest struct {
	LeaseID      string
	Token        string
	SessionToken string
}
