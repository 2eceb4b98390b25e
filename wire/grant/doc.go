// Package grant signs and verifies Leasehold grants: compact JWS tokens
// (RFC 7515, alg EdDSA with Ed25519, RFC 8037) in which the cluster states
// that it granted a lease: the cluster id, the key, the lease id, the
// holder, the fencing token, the key's limit and the lease's TTL. A
// resource that a holder shows a grant to can check, without reaching the
// cluster, that the fencing token it is shown was really issued (so a
// buggy or hostile client cannot raise the resource's highest-seen token at
// will), by verifying the grant against the cluster's key set (GET
// /v1/keys, a JWK Set of OKP Ed25519 keys, RFC 7517 and RFC 8037).
//
// Each server signs with a key of its own; the key set lists every
// server's current key and the keys retired recently (after a rotation, or
// from a removed server), so a grant signed just before a rotation still
// verifies. A key id (kid) is the RFC 7638 thumbprint of the public key.
//
// The time claims (iat, exp) come from the signing server's wall clock and
// the lease's remaining time: they are estimates for display and for
// refusing grants that are obviously stale, never a safety bound. A lease
// may end (released, revoked, expired) long before its grant's exp, and a
// renewed lease outlives it. What protects the resource is the fencing
// token: keep the highest one seen per key and refuse lower ones
// (client.FenceGuard.CheckGrant does both).
//
// The package needs only the standard library. Verifier caches a key set
// fetched from the cluster; KeySet.Verify checks against a set at hand.
package grant
