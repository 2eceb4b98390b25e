package api

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
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

// The server is split by route family. server itself is the dispatcher:
// the route table (routes.go), the wrapping every request goes through
// (authorisation, body and answer bounds, the service gate, forwarding to
// the leader, the control lease's gate) and the router. Each family of
// handlers is its own small type over the shared core: leaseAPI (leases,
// heartbeat, validate, grants), groupAPI (lease groups), sessionAPI
// (sessions, holder release), streamAPI (event streams, keep-alive
// streams), clusterAPI (membership, local state, snapshots), controlAPI
// (the control lease's routes) and infoAPI (health, readiness, metrics,
// the OpenAPI document, whoami).

// core is what every family of handlers shares: the node, the logger, the
// tokens and the bounds on bodies, answers and streams, with the helpers
// handlers use (decoding, error answers, scoped lookups, write deadlines).
type core struct {
	n         Node
	log       *slog.Logger
	tokens    *Tokens
	maxBody   int64
	keepAlive time.Duration
	// writeTimeout bounds writing an answer (limits.go).
	writeTimeout time.Duration
	// bodyTimeout bounds reading a request body (limits.go); streams
	// bounds event streams per client.
	bodyTimeout time.Duration
	streams     streamLimiter
}

// server is the handler returned by New.
type server struct {
	*core
	router  *httprouter.Router
	metrics *httpMetrics
	// fwd forwards a follower's requests to the leader.
	fwd *forwarder
	// control serves the control lease; nil when the node has none.
	control *Control

	// The families of handlers the route table names.
	leases   leaseAPI
	groups   groupAPI
	sessions sessionAPI
	live     streamAPI
	cluster  clusterAPI
	ctl      controlAPI
	info     infoAPI
}

// The families of handlers (see server).
type (
	leaseAPI   struct{ *core }
	groupAPI   struct{ *core }
	sessionAPI struct{ *core }
	streamAPI  struct{ *core }
	clusterAPI struct{ *core }
	controlAPI struct {
		*core
		control *Control
	}
	infoAPI struct {
		*core
		metrics *httpMetrics
	}
)

// New returns the HTTP handler of the v1 API serving n. It is safe for
// concurrent use. It panics if opts do not validate (Options.Validate).
func New(n Node, opts Options) http.Handler {
	if err := opts.Validate(); err != nil {
		panic(fmt.Errorf("api.New: %w", err))
	}
	opts = opts.withDefaults()
	c := &core{n: n, log: requestLogger(opts.Logger), tokens: opts.Tokens, maxBody: opts.MaxBodyBytes, keepAlive: opts.KeepAlive,
		bodyTimeout: opts.BodyTimeout, writeTimeout: opts.WriteTimeout, streams: streamLimiter{max: opts.MaxStreamsPerClient}}
	s := &server{core: c, leases: leaseAPI{c}, groups: groupAPI{c}, sessions: sessionAPI{c}, live: streamAPI{c},
		cluster: clusterAPI{c}, ctl: controlAPI{core: c}, info: infoAPI{core: c}}
	s.fwd = newForwarder(s.log, n, opts.ForwardTLS, opts.ForwardDial, opts.ForwardTimeout)
	if cn := n.ControlLease(); cn != nil {
		co := opts.Control
		co.Tokens, co.Logger = nil, s.log
		s.control = NewControl(cn, co)
		s.ctl.control = s.control
	}
	rs := s.allRoutes()
	s.metrics = newHTTPMetrics(n, rs)
	s.info.metrics = s.metrics
	s.router = s.newRouter(rs)
	return s
}

// newRouter routes rs, wrapped, and answers what no route matches with the
// contract's 404 and 405.
func (s *server) newRouter(rs []route) *httprouter.Router {
	r := httprouter.New()
	// An API answers the path it is given: no redirects, which would also
	// mangle escaped path parameters.
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	for i, rt := range rs {
		r.Handle(rt.method, rt.path, s.wrap(rt, s.metrics.routes[i]))
	}
	r.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusNotFound, &wire.Error{Code: wire.CodeNotFound,
			Message: "no route " + r.Method + " " + r.URL.Path})
	})
	r.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusMethodNotAllowed, &wire.Error{Code: wire.CodeMethodNotAllowed,
			Message: r.Method + " is not allowed here; allowed: " + w.Header().Get("Allow")})
	})
	r.PanicHandler = s.recoverPanic
	return r
}

// serveHook, when set (only by the package's tests: openapi_test.go), is
// handed every request with the server's own serving, to record the
// exchange and check it against the OpenAPI document. Nil in production.
var serveHook func(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc)

// ServeHTTP dispatches to the routes. Every answer, the router's own 404 and
// 405 included, carries X-Leasehold-Index and X-Request-Id and is counted
// in the metrics.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if serveHook != nil {
		serveHook(w, r, s.serveHTTP)
		return
	}
	s.serveHTTP(w, r)
}

func (s *server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	// The request's answer writer and its context are one allocation.
	x := new(requestState)
	r = tagRequestIn(&x.ctx, w, r)
	// The write deadline is decided once the route is known (wrap); the
	// router's own answers get the usual one when they are written.
	rw := &x.rw
	*rw = responseWriter{ResponseWriter: w, n: s.n, route: unmatched, deadline: s.core}
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
		if rt.flags&duplex != 0 {
			fullDuplex(w)
		}
		if s.tokens != nil {
			if scope := rt.scope(r); scope > ScopeNone {
				acc, ok := s.authorize(w, r, scope)
				if !ok {
					return
				}
				if acc != nil && rt.flags&unscoped != 0 {
					refuseScoped(w)
					return
				}
				r = withAccess(r, acc)
			}
		}
		// Every request sets or lifts its write deadline, so that none
		// inherits its connection's last one; a waitAnswer route's handler
		// sets it, and what answers before it does is written without one.
		switch {
		case rt.flags&waitAnswer != 0:
			if rw, ok := w.(*responseWriter); ok {
				rw.dlExtra = -1
			} else {
				s.noWriteDeadline(w)
			}
		case rt.flags&longAnswer != 0:
			s.noWriteDeadline(w)
			decideDeadline(w)
		default:
			s.writeDeadline(w, 0)
			decideDeadline(w)
		}
		if err := s.guardBody(w, r, rt.flags&progressBody != 0); err != nil {
			s.writeError(w, r, err)
			return
		}
		if err := s.serviceGated(rt); err != nil {
			s.writeError(w, r, err)
			return
		}
		if rt.flags&body == 0 {
			if err := s.refuseBody(r, rt); err != nil {
				s.writeError(w, r, err)
				return
			}
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

// requestState is what serveHTTP makes for one request, in one allocation.
type requestState struct {
	rw  responseWriter
	ctx requestCtx
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
	// deadline, until the answer's write deadline is decided, is what
	// sets it when the answer is written: with dlExtra 0 the usual one (a
	// router's own answer), -1 none (a waitAnswer route's answer before
	// its handler set one).
	deadline *core
	dlExtra  int8
}

// decideDeadline records that the answer's write deadline is set (or
// lifted) for good.
func decideDeadline(w http.ResponseWriter) {
	for {
		switch x := w.(type) {
		case *responseWriter:
			x.deadline = nil
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return
		}
	}
}

func (w *responseWriter) WriteHeader(status int) {
	if !w.wrote && status >= 200 {
		w.wrote = true
		w.status = status
		if c := w.deadline; c != nil {
			w.deadline = nil
			if w.dlExtra < 0 {
				c.noWriteDeadline(w.ResponseWriter)
			} else {
				c.writeDeadline(w.ResponseWriter, 0)
			}
		}
		h := w.Header()
		if !w.forwarded || h.Get(headerIndex) == "" {
			h[headerIndex] = indexValue(w.n.AppliedIndex()) // headerIndex is canonical
		}
		if _, ok := h["Date"]; !ok {
			h["Date"] = dateNow()
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// appliedValue is the X-Leasehold-Index value of one applied index.
type appliedValue struct {
	index uint64
	v     []string
}

// lastApplied is the latest applied index's value: the answers of one
// log entry's writes, and the reads between, share it.
var lastApplied atomic.Pointer[appliedValue]

// indexValue is the X-Leasehold-Index header value of applied index i. The
// slice is shared: nothing changes a header value in place.
func indexValue(i uint64) []string {
	if a := lastApplied.Load(); a != nil && a.index == i {
		return a.v
	}
	a := &appliedValue{index: i, v: []string{strconv.FormatUint(i, 10)}}
	a.v = a.v[:1:1]
	lastApplied.Store(a)
	return a.v
}

// date is the Date header's value for one second.
type date struct {
	unix int64
	v    []string
}

// lastDate is the latest second's Date header value.
var lastDate atomic.Pointer[date]

// dateNow is the Date header's value now, the same bytes net/http writes
// when an answer has none (it formats the time for every answer; this
// formats it once a second). The slice is shared: nothing changes a header
// value in place.
func dateNow() []string {
	now := time.Now()
	if d := lastDate.Load(); d != nil && d.unix == now.Unix() {
		return d.v
	}
	d := &date{unix: now.Unix(), v: []string{now.UTC().Format(http.TimeFormat)}}
	d.v = d.v[:1:1]
	lastDate.Store(d)
	return d.v
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

// healthz answers 200 while the process serves HTTP and its node can
// write its log; 503 UNAVAILABLE with the reason otherwise (a liveness
// probe should restart it).
func (s *infoAPI) healthz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) error {
	if err := s.n.HealthErr(); err != nil {
		writeErrorBody(w, http.StatusServiceUnavailable, &wire.Error{Code: wire.CodeUnavailable, Message: "unhealthy: " + err.Error()})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers 200 when the node is ready, 503 with the reason otherwise.
func (s *infoAPI) readyz(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	err := s.n.ReadyErr()
	if err == nil {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return nil
	}
	var ne *wire.Error
	e := &wire.Error{Code: wire.CodeUnavailable, Message: "not ready: " + err.Error()}
	if errors.As(err, &ne) && ne != nil && ne.Code != wire.CodeInternal {
		e = ne
	}
	writeErrorBody(w, http.StatusServiceUnavailable, e)
	return nil
}

// serviceGate is a node with a service gate (*node.Node's Gate): nil while
// it may serve, else 503 OUT_OF_SERVICE with its state and why.
type serviceGate interface{ Gate() error }

// serviceGated is the gate's refusal of a request of rt, nil when it may
// be served: a node out of service (diverged, damaged, removed, frozen)
// answers nothing from its state and forwards nothing, but for the routes
// an operator needs to see and repair it (anyState).
func (s *server) serviceGated(rt route) error {
	if rt.flags&anyState != 0 {
		return nil
	}
	if g, ok := s.n.(serviceGate); ok {
		return g.Gate()
	}
	return nil
}
