// Package client is a Go client for Leasehold's HTTP API (contract v1).
//
// A Client talks to one or more nodes. Reads, and writes that carry an
// idempotency key, move on to the next address when a node cannot be
// reached or answers 503 (no leader); any other write moves on only when the
// request provably never left this process (the connection was refused), so
// a write is never sent twice unless the server can tell the copies apart.
//
// Request and response bodies use the types of package wire, which package
// node names too (node.Lease is wire.Lease), so code that embeds a node and
// code that talks to one over HTTP read the same; the client links none of
// the server's dependencies (Raft, storage, gossip, the HTTP router). Every
// error answered by a server is an *APIError wrapping the decoded
// *wire.Error: errors.As(err, &wireErr) and
// errors.Is(err, &wire.Error{Code: wire.CodeLeaseHeld}) both work, and the
// HTTP status stays available on the *APIError.
//
// Two helpers carry out what the README asks of a holder. KeepAlive (and
// AcquireKeepAlive) renews a standalone lease every TTL/3 and tracks the
// holder's own deadline from the send time of the last successful renewal,
// on the monotonic clock: its Lost channel closes before the server could
// give the lease to anyone else, even when no server answers. FenceGuard is
// for the guarded resource: it refuses fencing tokens lower than the
// highest seen per key; with CheckGrant it first verifies the grant the
// holder shows (Client.GrantVerifier), so that only fencing tokens the
// cluster issued count.
//
// A Client is safe for concurrent use.
package client
