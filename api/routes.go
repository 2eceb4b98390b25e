package api

import (
	"net/http"

	"github.com/julienschmidt/httprouter"
)

// route is one route of the API and everything the server does around its
// handler: the scope a request needs, how a follower serves it, and how its
// body and answer are bounded. The tables below are the only place that
// says so; wrap, maybeForward, guardBody and the metrics read it from here.
type route struct {
	method string
	path   string
	// scope is the scope a request needs (ScopeNone: open, even with auth
	// on).
	scope func(*http.Request) Scope
	h     handlerFunc
	// fwd is how a follower serves the route: itself, or forwarded to the
	// leader, and then how (forward.go).
	fwd   forwardPlan
	flags routeFlags
}

// routeFlags say how a route's body and answer are bounded, and whether it
// is behind the control lease.
type routeFlags uint8

const (
	// duplex: the handler reads the body while it writes the answer (a
	// keep-alive stream; see fullDuplex).
	duplex routeFlags = 1 << iota
	// longAnswer: the answer may take long: no write deadline (event
	// streams, the control WebSocket, snapshot transfers), or one the
	// handler sets itself (a keep-alive stream: one per flush).
	longAnswer
	// waitAnswer: an acquire that may wait: its handler sets the write
	// deadline, wait_ms on top (waitDeadline); an answer written before
	// it does (a forward, a refusal) has none, as a longAnswer's.
	waitAnswer
	// progressBody: the body may be large (a snapshot upload of up to
	// 4 GiB) or have no end (a keep-alive stream): each read must arrive
	// within the body timeout, rather than the whole body, and the handler
	// applies its own size limit.
	progressBody
	// ungated: a mutating admin route that is not behind the control lease
	// (its break, which ends it). Every other request that is not a GET and
	// needs the admin scope is gated (controlGated).
	ungated
	// unscoped: a token restricted to some keys or holders is refused
	// (403), whatever its scope (the control lease's socket).
	unscoped
	// anyState: served whatever the server's service state (health,
	// readiness, metrics, local state, the membership repairs, the
	// console's files). Every other route is refused with 503
	// OUT_OF_SERVICE while the node's Gate says so (serviceGated).
	anyState
	// body: the route takes a request body. A request with a body on a
	// route without this flag is refused (400, refuseBody), as the
	// OpenAPI document says (no requestBody).
	body
)

// handlerFunc handles one route. A returned error is answered by
// writeError; a handler that returns nil has written its answer.
type handlerFunc func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error

func need(s Scope) func(*http.Request) Scope {
	return func(*http.Request) Scope { return s }
}

// endSessionScope: ending a session with its token is a write; ending it
// without (force) is an admin action.
func endSessionScope(r *http.Request) Scope {
	if r.Header.Get(headerSessionToken) != "" {
		return ScopeWrite
	}
	return ScopeAdmin
}

// holderReleaseScope: a token restricted to some holders releases the
// holders it may act as with the write scope (the handler checks the
// holder); for every other token, holder release is an admin action.
func (s *server) holderReleaseScope(r *http.Request) Scope {
	if s.tokens != nil {
		if token, ok := bearerToken(r); ok {
			if e, ok := s.tokens.lookup(token); ok && e.acc.holderScoped() {
				return ScopeWrite
			}
		}
	}
	return ScopeAdmin
}

// How a follower serves a route's requests (forwardPlan explains each
// field). Every write and every linearizable read goes to the leader; the
// event stream, health, readiness, metrics, local state, the control
// WebSocket and the console are this node's own, and a GET with
// ?stale=true is always answered here.
var (
	// serveHere: never forwarded.
	serveHere = forwardPlan{}
	// forwardRead: a read, sent again to the leader of the moment if the
	// forward fails.
	forwardRead = forwardPlan{forward: true, read: true, bounded: true, followLeader: true}
	// forwardWrite: a write, abandoned when another node leads.
	forwardWrite = forwardPlan{forward: true, bounded: true, followLeader: true}
	// forwardAcquire: the body is read first, to find its wait_ms, which
	// the forward's deadline grows by.
	forwardAcquire = forwardPlan{forward: true, bounded: true, followLeader: true, bufferBody: true, waitBudget: true}
	// forwardValidate: a read with a body, read first so that it can be
	// sent again.
	forwardValidate = forwardPlan{forward: true, read: true, bounded: true, followLeader: true, bufferBody: true}
	// forwardLongRead and forwardLongWrite have no deadline (snapshot
	// transfers, whose size has no bound; the keep-alive stream, proxied
	// both ways at once): only a leader change ends them (the client then
	// opens another).
	forwardLongRead  = forwardPlan{forward: true, read: true, followLeader: true}
	forwardLongWrite = forwardPlan{forward: true, followLeader: true}
	// forwardMembership: a route whose outcome is a leader change is not
	// abandoned when the leader changes.
	forwardMembership = forwardPlan{forward: true, bounded: true}
)

// routes lists the routes of the lease API: every route of the contract
// (openapi.yaml says what each does) but the control lease's
// (controlRoutes) and the console's (consoleRoutes).
func (s *server) routes() []route {
	return []route{
		{"POST", "/v1/leases", need(ScopeWrite), s.leases.acquire, forwardAcquire, waitAnswer | body},
		{"GET", "/v1/leases", need(ScopeRead), s.leases.listLeases, forwardRead, 0},
		{"GET", "/v1/leases/:id", need(ScopeRead), s.leases.getLease, forwardRead, 0},
		{"POST", "/v1/leases/:id/renew", need(ScopeWrite), s.leases.renew, forwardWrite, body},
		{"DELETE", "/v1/leases/:id", need(ScopeWrite), s.leases.release, forwardWrite, body},
		{"POST", "/v1/leases/:id/revoke", need(ScopeAdmin), s.leases.revoke, forwardWrite, body},
		{"POST", "/v1/heartbeat", need(ScopeWrite), s.leases.heartbeat, forwardWrite, body},
		{"POST", "/v1/keepalive", need(ScopeWrite), s.live.keepAliveRenewals, forwardLongWrite, duplex | longAnswer | progressBody | body},

		{"POST", "/v1/groups", need(ScopeWrite), s.groups.acquireGroup, forwardAcquire, waitAnswer | body},
		{"GET", "/v1/groups/:id", need(ScopeRead), s.groups.getGroup, forwardRead, 0},
		{"POST", "/v1/groups/:id/renew", need(ScopeWrite), s.groups.renewGroup, forwardWrite, body},
		{"DELETE", "/v1/groups/:id", need(ScopeWrite), s.groups.releaseGroup, forwardWrite, body},

		{"POST", "/v1/sessions", need(ScopeWrite), s.sessions.createSession, forwardWrite, body},
		{"GET", "/v1/sessions", need(ScopeRead), s.sessions.listSessions, forwardRead, 0},
		{"GET", "/v1/sessions/:id", need(ScopeRead), s.sessions.getSession, forwardRead, 0},
		{"POST", "/v1/sessions/:id/heartbeat", need(ScopeWrite), s.sessions.sessionHeartbeat, forwardWrite, body},
		// End a session and its leases; without X-Session-Token, admin only.
		{"DELETE", "/v1/sessions/:id", endSessionScope, s.sessions.endSession, forwardWrite, 0},

		// End every lease and session of a holder (crash recovery): admin,
		// or a write token restricted to holders that include it.
		{"POST", "/v1/holders/:holder/release", s.holderReleaseScope, s.sessions.releaseHolder, forwardWrite, body},
		{"GET", "/v1/openapi.json", need(ScopeNone), s.info.openAPI, serveHere, anyState},
		{"GET", "/v1/keys", need(ScopeNone), s.leases.keys, forwardRead, 0},
		{"POST", "/v1/validate", need(ScopeRead), s.leases.validate, forwardValidate, body},
		{"GET", "/v1/events", need(ScopeRead), s.live.events, serveHere, longAnswer},

		{"GET", "/v1/cluster", need(ScopeRead), s.cluster.clusterStatus, forwardRead, 0},
		{"GET", "/v1/cluster/local", need(ScopeAdmin), s.cluster.localState, serveHere, anyState},
		{"DELETE", "/v1/cluster/members/:id", need(ScopeAdmin), s.cluster.removeMember, forwardMembership, anyState},
		{"POST", "/v1/cluster/transfer-leadership", need(ScopeAdmin), s.cluster.transferLeadership, forwardMembership, anyState | body},
		{"GET", "/v1/cluster/snapshot", need(ScopeAdmin), s.cluster.saveSnapshot, forwardLongRead, longAnswer},
		{"PUT", "/v1/cluster/snapshot", need(ScopeAdmin), s.cluster.restoreSnapshot, forwardLongWrite, longAnswer | progressBody | body},

		{"GET", "/healthz", need(ScopeNone), s.info.healthz, serveHere, anyState},
		{"GET", "/readyz", need(ScopeNone), s.info.readyz, serveHere, anyState},
		{"GET", "/metrics", need(ScopeNone), s.info.metricsText, serveHere, anyState},
	}
}

// controlRoutes are the routes of the control lease (control.go), served
// when the node has one.
func (s *server) controlRoutes() []route {
	return []route{
		{"GET", "/v1/control/ws", need(ScopeWrite), s.ctl.controlSocket, serveHere, longAnswer | unscoped},
		{"GET", "/v1/control/status", need(ScopeRead), s.ctl.controlStatus, forwardRead, 0},
		{"POST", controlBreakPath, need(ScopeAdmin), s.ctl.breakControl, forwardWrite, ungated},
	}
}

// consoleRoutes serve the web console's static files (ui.go). They need no
// token even when auth is on (the files hold no data; the console sends the
// user's bearer token on every API call it makes), and a follower serves
// them itself.
func (s *server) consoleRoutes() []route {
	return []route{
		{"GET", "/", need(ScopeNone), consoleRedirect, serveHere, anyState},
		{"GET", "/ui", need(ScopeNone), consoleRedirect, serveHere, anyState},
		{"GET", uiPrefix + "*file", need(ScopeNone), consoleFile, serveHere, anyState},
		// Who the presented bearer token is, for the console to offer the
		// actions its scope allows. Without auth: scope admin.
		{"GET", "/v1/whoami", need(ScopeRead), s.info.whoami, serveHere, anyState},
	}
}

// allRoutes are the routes New mounts.
func (s *server) allRoutes() []route {
	rs := s.routes()
	if s.control != nil {
		rs = append(rs, s.controlRoutes()...)
	}
	return append(rs, s.consoleRoutes()...)
}

// controlGated reports whether a request of rt is behind the control
// lease: a mutating admin request (any request but a GET that needs the
// admin scope) of a route not marked ungated. Reads stay open to everyone,
// as the control protocol's mutability matrix says.
func controlGated(rt route, r *http.Request) bool {
	return rt.method != http.MethodGet && rt.flags&ungated == 0 && rt.scope(r) == ScopeAdmin
}
