package api

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/node"
)

// Headers of the contract.
const (
	headerIndex        = "X-Leasehold-Index"
	headerLeaseToken   = "X-Lease-Token"
	headerSessionToken = "X-Session-Token"
)

// DefaultKeepAlive is how often an idle event stream gets a comment line, so
// that proxies and clients can tell a quiet stream from a dead one.
const DefaultKeepAlive = 15 * time.Second

// Options configure the handler. The zero value is usable: no logging, auth
// off, 64 KiB bodies, 15 s keep-alives.
type Options struct {
	// Logger receives request failures and admin actions; nil discards.
	Logger *slog.Logger
	// Tokens enables bearer-token auth; nil turns auth off.
	Tokens *Tokens
	// MaxBodyBytes limits request bodies, in bytes. Default 64 KiB.
	MaxBodyBytes int64
	// KeepAlive is the interval of comment lines on idle event streams.
	// Default 15s.
	KeepAlive time.Duration
	// ForwardTLS is the client side of TLS for forwarding to the leader
	// (the leader's certificate is verified against its RootCAs, and its
	// client certificate answers a leader that requires one). When set,
	// requests are forwarded over https; nil: over http, unless the request
	// itself came over TLS, then https with the system roots.
	ForwardTLS *tls.Config
	// ForwardDial, if set, opens the connections a follower forwards
	// requests to the leader over (embedders with a custom network; the
	// chaos suite injects faults through it). Nil: TCP with a 2 s timeout.
	ForwardDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ForwardTimeout bounds a request a follower forwards to the leader
	// (an acquire: its wait_ms plus this). A forward is also abandoned as
	// soon as another node leads. A write cut short so is answered 504
	// INDETERMINATE, or 503 NO_LEADER when none of it was sent; a read is
	// tried again on the new leader. Snapshot transfers have no deadline.
	// Default DefaultForwardTimeout.
	ForwardTimeout time.Duration
	// BodyTimeout is how long a client has to send a request body (for a
	// snapshot upload: between two reads); the answer to a late one is 400.
	// Requests without a body, event streams among them, are not bounded.
	// Default 30s; negative: no limit.
	BodyTimeout time.Duration
	// WriteTimeout bounds how long an answer may take to be written, from
	// the request's arrival (a client that does not read its answers
	// cannot hold a connection and its buffers for ever). It does not
	// apply to event streams, control WebSockets and snapshot transfers; a
	// local acquire gets its wait_ms on top. Default DefaultWriteTimeout;
	// negative: no limit.
	WriteTimeout time.Duration
	// MaxStreamsPerClient bounds the event streams one client address has
	// open at once (429 RESOURCE_EXHAUSTED beyond). Default 128; negative:
	// no limit. The node bounds the total (node.Config.MaxEventStreams).
	MaxStreamsPerClient int
	// Control configures the control lease routes (served when the node
	// implements ControlNode, as *node.Node does); its Tokens and Logger
	// are ignored (the API's own apply).
	Control ControlOptions
}

// server is the handler returned by New.
type server struct {
	n         Node
	log       *slog.Logger
	tokens    *Tokens
	maxBody   int64
	keepAlive time.Duration
	router    *httprouter.Router
	metrics   *httpMetrics
	// locator and fwd forward a follower's requests to the leader.
	locator leaderLocator
	fwd     *forwarder
	// writeTimeout bounds writing an answer (limits.go).
	writeTimeout time.Duration
	// bodyTimeout bounds reading a request body (limits.go); streams
	// bounds event streams per client.
	bodyTimeout time.Duration
	streams     streamLimiter
	// control serves the control lease; nil when the node has none.
	control *Control
}

// New returns the HTTP handler of the v1 API serving n. It is safe for
// concurrent use.
func New(n Node, opts Options) http.Handler {
	s := &server{
		n:         n,
		log:       opts.Logger,
		tokens:    opts.Tokens,
		maxBody:   opts.MaxBodyBytes,
		keepAlive: opts.KeepAlive,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.keepAlive <= 0 {
		s.keepAlive = DefaultKeepAlive
	}
	switch s.bodyTimeout = opts.BodyTimeout; {
	case s.bodyTimeout == 0:
		s.bodyTimeout = DefaultBodyTimeout
	case s.bodyTimeout < 0:
		s.bodyTimeout = 0
	}
	switch s.writeTimeout = opts.WriteTimeout; {
	case s.writeTimeout == 0:
		s.writeTimeout = DefaultWriteTimeout
	case s.writeTimeout < 0:
		s.writeTimeout = 0
	}
	switch s.streams.max = opts.MaxStreamsPerClient; {
	case s.streams.max == 0:
		s.streams.max = DefaultMaxStreamsPerClient
	case s.streams.max < 0:
		s.streams.max = 0
	}
	if l, ok := n.(leaderLocator); ok {
		s.locator, s.fwd = l, newForwarder(s.log, l, opts.ForwardTLS, opts.ForwardDial, opts.ForwardTimeout)
	}
	if cn, ok := n.(ControlNode); ok {
		co := opts.Control
		co.Tokens, co.Logger, co.ForwardTLS, co.ForwardDial = nil, s.log, opts.ForwardTLS, opts.ForwardDial
		s.control = NewControl(cn, co)
	}
	rs := append(append(s.routes(), s.controlRoutes()...), s.uiRoutes()...)
	s.metrics = newHTTPMetrics(n, rs)
	r := httprouter.New()
	// An API answers the path it is given: no redirects, which would also
	// mangle escaped path parameters.
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	for i, rt := range rs {
		r.Handle(rt.method, rt.path, s.wrap(rt, s.metrics.routes[i]))
	}
	r.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusNotFound, &node.Error{Code: node.CodeNotFound,
			Message: "no route " + r.Method + " " + r.URL.Path})
	})
	r.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusMethodNotAllowed, &node.Error{Code: node.CodeMethodNotAllowed,
			Message: r.Method + " is not allowed here; allowed: " + w.Header().Get("Allow")})
	})
	r.PanicHandler = s.recoverPanic
	s.router = r
	return s
}

// route is one route of the API.
type route struct {
	method string
	path   string
	// scope is the scope the request needs (ScopeNone: open).
	scope func(*http.Request) Scope
	h     handlerFunc
}

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

// routes lists every route of the API with the scope it needs.
func (s *server) routes() []route {
	return []route{
		// Acquire a lease: 201 with the lease and its token, 200 on an
		// idempotent replay.
		{"POST", "/v1/leases", need(ScopeWrite), s.acquire},
		// List leases by key, prefix, holder, session_id, state; paged.
		{"GET", "/v1/leases", need(ScopeRead), s.listLeases},
		// Read one lease, in any state still retained.
		{"GET", "/v1/leases/:id", need(ScopeRead), s.getLease},
		// Renew a standalone lease (X-Lease-Token, optional ttl_ms).
		{"POST", "/v1/leases/:id/renew", need(ScopeWrite), s.renew},
		// Release a lease (X-Lease-Token, or X-Session-Token if bound).
		{"DELETE", "/v1/leases/:id", need(ScopeWrite), s.release},
		// Force-release a lease as an operator.
		{"POST", "/v1/leases/:id/revoke", need(ScopeAdmin), s.revoke},
		// Renew many standalone leases at once; per-item results.
		{"POST", "/v1/heartbeat", need(ScopeWrite), s.heartbeat},
		// A stream of single-lease renewals, answered as each commits.
		{"POST", "/v1/keepalive", need(ScopeWrite), s.keepAliveRenewals},

		// Create a session: 201 with its token.
		{"POST", "/v1/sessions", need(ScopeWrite), s.createSession},
		// List sessions, optionally of one holder; paged.
		{"GET", "/v1/sessions", need(ScopeRead), s.listSessions},
		// Read one session.
		{"GET", "/v1/sessions/:id", need(ScopeRead), s.getSession},
		// Renew a session and so every lease bound to it (X-Session-Token).
		{"POST", "/v1/sessions/:id/heartbeat", need(ScopeWrite), s.sessionHeartbeat},
		// End a session and its leases; without X-Session-Token, admin only.
		{"DELETE", "/v1/sessions/:id", endSessionScope, s.endSession},

		// End every lease and session of a holder (crash recovery).
		{"POST", "/v1/holders/:holder/release", need(ScopeAdmin), s.releaseHolder},
		// Is a fencing token or lease token currently valid? Linearizable.
		{"POST", "/v1/validate", need(ScopeRead), s.validate},
		// Server-Sent Events of lease and session changes.
		{"GET", "/v1/events", need(ScopeRead), s.events},

		// Cluster status: leader, indexes, tick, members.
		{"GET", "/v1/cluster", need(ScopeRead), s.clusterStatus},
		// This node's own view and state hash (never forwarded).
		{"GET", "/v1/cluster/local", need(ScopeAdmin), s.localState},
		// Remove a server from the cluster.
		{"DELETE", "/v1/cluster/members/:id", need(ScopeAdmin), s.removeMember},
		// Hand leadership to a given voter (or any).
		{"POST", "/v1/cluster/transfer-leadership", need(ScopeAdmin), s.transferLeadership},
		// Stream a snapshot file of the whole state (backup).
		{"GET", "/v1/cluster/snapshot", need(ScopeAdmin), s.saveSnapshot},
		// Replace the whole state with a snapshot file (restore).
		{"PUT", "/v1/cluster/snapshot", need(ScopeAdmin), s.restoreSnapshot},

		// Liveness: 200 while the process serves HTTP.
		{"GET", "/healthz", need(ScopeNone), s.healthz},
		// Readiness: 200 when a leader is known and this node caught up.
		{"GET", "/readyz", need(ScopeNone), s.readyz},
		// Prometheus text exposition.
		{"GET", "/metrics", need(ScopeNone), s.metricsText},
	}
}

// ServeHTTP dispatches to the routes. Every answer, the router's own 404 and
// 405 included, carries X-Leasehold-Index and is counted in the metrics.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &responseWriter{ResponseWriter: w, n: s.n, route: unmatched}
	s.writeDeadline(w, 0) // every request, so none inherits its connection's last deadline
	if r.URL.RawPath != "" {
		// The path has escapes that decoding would make ambiguous (a holder
		// "a/b" sent as a%2Fb): route on the escaped path and unescape the
		// parameters in wrap.
		u := *r.URL
		u.Path, u.RawPath = u.RawPath, ""
		r = r.WithContext(r.Context())
		r.URL = &u
		rw.escapedPath = true
	}
	s.router.ServeHTTP(rw, r)
	if !rw.wrote {
		rw.WriteHeader(http.StatusOK)
	}
	s.metrics.observe(rw.route, rw.status, time.Since(start))
}

// wrap turns a route into the router's handle: authorization first, then
// the handler, then error answers.
func (s *server) wrap(rt route, labels *routeLabels) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		if rw, ok := w.(*responseWriter); ok {
			rw.route = labels
			if rw.escapedPath {
				for i := range ps {
					if v, err := url.PathUnescape(ps[i].Value); err == nil {
						ps[i].Value = v
					}
				}
			}
		}
		if duplexRoutes[rt.method+" "+rt.path] {
			fullDuplex(w)
		}
		if s.tokens != nil {
			if scope := rt.scope(r); scope > ScopeNone && !s.authorize(w, r, scope) {
				return
			}
		}
		if longWrites[rt.method+" "+rt.path] {
			s.noWriteDeadline(w)
		}
		if err := s.guardBody(w, r, rt.path); err != nil {
			s.writeError(w, r, err)
			return
		}
		if s.maybeForward(w, r, rt) {
			return
		}
		if s.control != nil && controlGated(rt, r) && !s.control.gate(w, r) {
			return
		}
		if err := rt.h(w, r, ps); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// recoverPanic answers a panicking handler with 500 and logs it.
func (s *server) recoverPanic(w http.ResponseWriter, r *http.Request, v any) {
	if v == http.ErrAbortHandler {
		panic(v)
	}
	s.log.LogAttrs(r.Context(), slog.LevelError, "handler panic",
		slog.String("method", r.Method), slog.String("route", routeOf(w)), slog.Any("panic", v))
	if rw, ok := w.(*responseWriter); ok && rw.wrote {
		return
	}
	writeErrorBody(w, http.StatusInternalServerError, internalError())
}

// responseWriter stamps X-Leasehold-Index on the answer and remembers its
// status for the metrics.
type responseWriter struct {
	http.ResponseWriter
	n           Node
	route       *routeLabels
	status      int
	wrote       bool
	escapedPath bool
	forwarded   bool // the leader's answer passes through, its index header too
}

func (w *responseWriter) WriteHeader(status int) {
	if !w.wrote && status >= 200 {
		w.wrote = true
		w.status = status
		if !w.forwarded || w.Header().Get(headerIndex) == "" {
			w.Header().Set(headerIndex, strconv.FormatUint(w.n.AppliedIndex(), 10))
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush sends buffered data to the client (event streams).
func (w *responseWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands the connection over (a later WebSocket route); the answer is
// then no longer ours to write.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("api: connection cannot be hijacked")
	}
	conn, rw, err := h.Hijack()
	if err == nil {
		w.wrote = true
		w.status = http.StatusSwitchingProtocols
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// routeOf names the matched route of a request for logs.
func routeOf(w http.ResponseWriter) string {
	if rw, ok := w.(*responseWriter); ok && rw.route != nil {
		return rw.route.path
	}
	return ""
}

// healthz answers 200 while the process serves HTTP.
func (s *server) healthz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers 200 when the node is ready, 503 with the reason otherwise.
func (s *server) readyz(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	err := s.n.ReadyErr()
	if err == nil {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return nil
	}
	var ne *node.Error
	e := &node.Error{Code: node.CodeUnavailable, Message: "not ready: " + err.Error()}
	if errors.As(err, &ne) && ne != nil && ne.Code != node.CodeInternal {
		e = ne
	}
	writeErrorBody(w, http.StatusServiceUnavailable, e)
	return nil
}
