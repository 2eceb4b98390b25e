// Package wire holds what Leasehold's servers and clients exchange: the
// request and response types of the v1 API (Lease, Session, AcquireRequest,
// Event, ClusterStatus, ...), the contract's error codes with the Error
// type every error answer carries, the one table from error code to HTTP
// status (HTTPStatus), and the snapshot file format (ReadSnapshotFile).
//
// It is the one home of these definitions: package fsm, package node, api
// and api/client all use them under these names, so an application that
// embeds a node and one that talks to a server through package api/client
// use the same types; api
// answers errors with the status HTTPStatus gives, and the client falls
// back to CodeForStatus for an error answer that carries no code.
//
// Guarantees callers may rely on:
//
//   - The package imports only the standard library, and not net/http:
//     the pure state machine imports it for its codes without linking HTTP
//     or any I/O, and the client links none of the server's dependencies
//     (Raft, its storage, gossip, the HTTP router). Tests hold both.
//   - Every code is in the status table; a code missing from it would be
//     answered as 500 INTERNAL.
//   - The JSON field names are the contract's; adding a field is
//     compatible, renaming or removing one is not.
//   - The types are plain data (no goroutines, no locks): safe to copy
//     and to read concurrently.
package wire
