// Package api is Leasehold's HTTP API: the routes of the v1 contract on top
// of one embedded node.
//
// The package is HTTP only. It decodes and checks the shape of requests,
// authenticates and authorises them, calls the node through the small Node
// interface it declares, and encodes answers and errors. Every business rule
// (what a valid key is, who may release what, when a lease expires) belongs
// to the node; the handler translates its errors to status codes in one place
// (statusFor, which is package wire's one table, wire.HTTPStatus).
//
// Guarantees callers may rely on:
//
//   - Every response carries X-Leasehold-Index, the node's applied Raft index
//     read after the operation.
//   - Every error body is {"error": {"code", "message", ...details}} with a
//     contract code; errors the handler does not recognise become 500
//     INTERNAL with a generic message (the cause is logged, never sent).
//   - Request bodies are limited (64 KiB by default, 413 PAYLOAD_TOO_LARGE
//     above) and decoded strictly: unknown fields and trailing data are 400
//     INVALID_ARGUMENT.
//   - With Options.Tokens set, every route but /healthz, /readyz and
//     /metrics needs a bearer token whose scope covers the route (read <
//     write < admin). A request that fails authentication or authorisation,
//     or whose body or parameters cannot be decoded, never reaches the node.
//     A read or write token may be scoped to some keys and holders
//     (LoadTokens); what each route does with one is in scoped.go and
//     docs/security.md.
//   - Secret tokens (bearer, lease and session tokens) and request bodies are
//     never logged.
//
// The control lease (a WebSocket-owned global lock that gates
// the mutating admin routes) is served at /v1/control/ws and
// /v1/control/status when the node has one (Node.ControlLease; FromNode's
// node has); an application embedding a node can mount the same handlers
// at its own paths (see Control).
//
// Options and ControlOptions: a numeric field left zero means its default;
// where a bound can be lifted (Options.BodyTimeout, WriteTimeout,
// MaxStreamsPerClient) a negative value lifts it, and elsewhere a negative
// value is invalid. Packages node and cluster follow the same rule.
//
// The handler is safe for concurrent use. Event streams (GET /v1/events) end
// when the client goes away, when the node ends the subscription, or when
// the request context is cancelled: give http.Server a BaseContext that is
// cancelled on shutdown so that Shutdown need not wait for open streams.
package api
