package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// headerForwarded marks a request a follower forwarded to the leader; the
// leader answers it itself and never forwards it again (if leadership moved
// in between, the answer is NO_LEADER and the client retries).
const headerForwarded = "X-Leasehold-Forwarded-By"

// DefaultForwardTimeout bounds a request a follower forwards to the leader:
// an acquire may take its wait_ms plus this, any other request this. A
// forward that outlives it is answered INDETERMINATE (or NO_LEADER when
// nothing was sent); a read is tried again on the leader instead.
const DefaultForwardTimeout = 3 * time.Second

// Retries of a forwarded read (GET, POST /v1/validate) that failed: up to
// readAttempts tries in all, each after the leader changed or, failing
// that, after readRetryPause.
const (
	readAttempts   = 4
	readRetryPause = time.Second
	// notReadyPause: the leader answered a read 503 (just elected, still
	// applying its predecessors' entries).
	notReadyPause = 100 * time.Millisecond
)

// leaderPoll is how often a follower with forwards in flight looks at who
// leads: a forward to a leader that lost its place is abandoned.
const leaderPoll = 50 * time.Millisecond

// forwarder proxies requests from a follower to the leader.
type forwarder struct {
	proxy   *httputil.ReverseProxy
	tls     bool          // forward over https
	timeout time.Duration // see DefaultForwardTimeout
	watch   *leaderWatch
	log     interface {
		Warn(msg string, args ...any)
	}
}

func newForwarder(log interface {
	Warn(msg string, args ...any)
}, loc Locator, tlsConf *tls.Config, dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) *forwarder {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: 5 * time.Second,
		// A leader's answer head is as bounded as a client's request
		// head (http.DefaultMaxHeaderBytes); the transport's default
		// would let a broken leader make every forward hold 10 MB.
		MaxResponseHeaderBytes: http.DefaultMaxHeaderBytes,
	}
	f := &forwarder{tls: tlsConf != nil, timeout: timeout, log: log,
		watch: &leaderWatch{loc: loc, every: leaderPoll}}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			a := pr.In.Context().Value(forwardAttemptKey{}).(*forwardAttempt)
			pr.SetURL(a.target)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			if !a.read {
				// http.Transport replays a request without a body on a
				// reused connection that failed when it carries one of
				// these headers: a write must reach the leader at most
				// once per forward. The leader does not read them (the
				// contract's idempotency key is a body field).
				pr.Out.Header.Del("Idempotency-Key")
				pr.Out.Header.Del("X-Idempotency-Key")
			}
		},
		ModifyResponse: func(res *http.Response) error {
			a := res.Request.Context().Value(forwardAttemptKey{}).(*forwardAttempt)
			if res.StatusCode < 200 || res.StatusCode > 599 {
				// Not an answer of a leader (a 1xx that is not
				// informational, 101 to a request that asked for no
				// upgrade, or no HTTP status at all): passed on, it would
				// be an invalid status or a panic of WriteHeader.
				return errLeaderBadStatus
			}
			// The follower's answer already carries the request id.
			res.Header.Del(headerRequestID)
			if a.retryUnavailable && res.StatusCode == http.StatusServiceUnavailable {
				return errLeaderNotReady
			}
			return nil
		},
		Transport:     tr,
		FlushInterval: -1, // event streams and long waits pass through at once
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			// Only called before anything was written to the client:
			// the caller decides between an answer and a retry.
			r.Context().Value(forwardAttemptKey{}).(*forwardAttempt).err = err
		},
	}
	return f
}

// forwardAttempt is one try at sending a request to the leader.
type forwardAttempt struct {
	target *url.URL
	read   bool
	// retryUnavailable: a 503 answer is not passed on but tried again.
	retryUnavailable bool
	// sent: some of the request may have been written to the leader's
	// connection. Reset when the transport starts over on another
	// connection, which it only does for a write when nothing was written.
	sent atomic.Bool
	err  error // the proxy's error, if the attempt failed before answering
}

type forwardAttemptKey struct{}

// Why a forward was abandoned (the outbound request's cancel cause).
var (
	errLeaderChanged  = errors.New("the leader changed while the request was in flight")
	errForwardTimeout = errors.New("the leader did not answer in time")
	errLeaderNotReady = errors.New("the leader answered 503")
	// errLeaderBadStatus: the leader's answer has a status outside
	// 200-599. A write it answered so may have been applied.
	errLeaderBadStatus = errors.New("the leader's answer has no valid HTTP status")
)

// forwardPlan is how a follower serves a route's requests; the route
// table (routes.go) gives each route its plan.
type forwardPlan struct {
	// forward: a follower sends the requests to the leader; otherwise it
	// answers them itself. A GET with ?stale=true is answered here all the
	// same (forwards).
	forward bool
	// read: the request changes nothing, so it may be sent again (GET,
	// POST /v1/validate).
	read bool
	// bounded: the forward has a deadline (not snapshot transfers, whose
	// size has no bound, nor the keep-alive stream; a leader change still
	// ends them).
	bounded bool
	// followLeader: abandon the forward when another node leads (not for
	// the routes whose outcome is a leader change).
	followLeader bool
	// bufferBody: read the body first (to find wait_ms, or to send a read
	// again).
	bufferBody bool
	// waitBudget: the deadline grows by the buffered body's wait_ms (an
	// acquire may wait that long for its lease).
	waitBudget bool
}

// forwards reports whether a follower sends r, a request of a route with
// plan p, to the leader: a route's stale reads (a GET with ?stale=true)
// are answered here.
func (p forwardPlan) forwards(r *http.Request) bool {
	return p.forward && !(r.Method == http.MethodGet && isTrue(r.URL.Query().Get("stale")))
}

// notSent reports an error that proves the request never reached the
// leader: the connection could not be opened.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || tlsRefused(err)
}

func noLeaderReach(err error) (int, *wire.Error) {
	return http.StatusServiceUnavailable, &wire.Error{Code: wire.CodeNoLeader,
		Message: "the leader could not be reached: " + err.Error()}
}

func indeterminateForward(err error) (int, *wire.Error) {
	return http.StatusGatewayTimeout, &wire.Error{Code: wire.CodeIndeterminate,
		Message: "the connection to the leader failed while the request was in flight; it may or may not have been applied: " + err.Error()}
}

// failedForward is the answer to a forward that failed: a read, or a
// write that was never sent, is NO_LEADER (retryable); a write that may
// have been sent is INDETERMINATE.
func failedForward(a *forwardAttempt, err error) (int, *wire.Error) {
	if a.read || !a.sent.Load() || notSent(a.err) {
		return noLeaderReach(err)
	}
	return indeterminateForward(err)
}

func isTrue(s string) bool { return s == "true" || s == "1" }

// maybeForward proxies r to the leader when this node is a follower that
// knows the leader's HTTP address, and reports whether it answered r. A
// forward is bounded (DefaultForwardTimeout, plus wait_ms for an acquire)
// and abandoned as soon as another node leads; a read that failed is sent
// again to the leader of the moment, or answered here if that is this node.
func (s *server) maybeForward(w http.ResponseWriter, r *http.Request, rt route) bool {
	if r.Header.Get(headerForwarded) != "" || !rt.fwd.forwards(r) {
		return false
	}
	info, ok := s.n.Leader()
	if !ok || info.Self || info.HTTPAddr == "" {
		return false
	}
	plan := rt.fwd
	body, budget, err := s.forwardBody(w, r, plan)
	if err != nil {
		s.writeError(w, r, err)
		return true
	}
	ctx := r.Context()
	if plan.bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, budget, errForwardTimeout)
		defer cancel()
	}
	for attempt := 1; ; attempt++ {
		a, out := s.newAttempt(r, body, info, plan, attempt)
		if rw, ok := w.(*responseWriter); ok {
			rw.forwarded = true
		}
		err := s.fwd.send(ctx, w, out, a, info, plan.followLeader)
		if err == nil {
			s.metrics.forwarded.WithLabelValues("proxied").Inc()
			return true
		}
		if !errors.Is(err, errLeaderNotReady) {
			s.fwd.log.Warn("forwarding to the leader failed", "method", r.Method, "path", r.URL.Path,
				"leader", info.ID, "attempt", attempt, "err", err, "request_id", requestIDFrom(r.Context()))
		}
		if !plan.read || attempt >= readAttempts || r.Context().Err() != nil || ctx.Err() != nil {
			s.forwardFailed(w, a, err)
			return true
		}
		// A read changes nothing: try again on whoever leads now.
		pause := readRetryPause
		if errors.Is(err, errLeaderNotReady) {
			pause = notReadyPause
		}
		next, ok := s.fwd.watch.next(ctx, info, pause)
		switch {
		case !ok, notSent(a.err) && !replaced(info, next, ok):
			// No leader, or still the one that could not be reached.
			s.forwardFailed(w, a, err)
			return true
		case next.Self:
			// This node leads now: it answers the read itself.
			s.answerHere(w, r, body)
			return false
		}
		info = next
	}
}

// forwardBody reads the body of r before it is forwarded when plan says
// so (to find its wait_ms, or to send a read again), and returns it (nil
// when it stays unread) with the forward's time budget.
func (s *server) forwardBody(w http.ResponseWriter, r *http.Request, plan forwardPlan) ([]byte, time.Duration, error) {
	budget := s.fwd.timeout
	if !plan.bufferBody || r.Body == nil || r.Body == http.NoBody {
		return nil, budget, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		return nil, 0, decodeError(err)
	}
	if plan.waitBudget {
		budget += waitOf(body)
	}
	return body, budget, nil
}

// newAttempt prepares try number attempt of forwarding r, whose body (if
// not nil) was read, to the leader info.
func (s *server) newAttempt(r *http.Request, body []byte, info node.LeaderInfo, plan forwardPlan, attempt int) (*forwardAttempt, *http.Request) {
	a := &forwardAttempt{read: plan.read, retryUnavailable: plan.read && attempt < readAttempts,
		target: &url.URL{Scheme: "http", Host: info.HTTPAddr}}
	if r.TLS != nil || s.fwd.tls {
		a.target.Scheme = "https"
	}
	out := r
	if body != nil {
		out = r.Clone(r.Context())
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
	}
	out.Header.Set(headerForwarded, s.n.NodeID())
	return a, out
}

// forwardFailed answers a forward that failed (failedForward).
func (s *server) forwardFailed(w http.ResponseWriter, a *forwardAttempt, err error) {
	status, e := failedForward(a, err)
	writeErrorBody(w, status, e)
	s.metrics.forwarded.WithLabelValues("failed").Inc()
}

// answerHere readies r, a read that was being forwarded, to be answered
// by this node, which leads now.
func (s *server) answerHere(w http.ResponseWriter, r *http.Request, body []byte) {
	if rw, ok := w.(*responseWriter); ok {
		rw.forwarded = false
	}
	r.Header.Del(headerForwarded)
	s.metrics.forwarded.WithLabelValues("local").Inc()
	if body != nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
}

// send makes one attempt: it proxies r to the leader info and returns nil
// once the leader's answer (or the client's disappearance) ended the
// request, or the error that kept the leader from answering, written to
// nobody yet.
func (f *forwarder) send(ctx context.Context, w http.ResponseWriter, r *http.Request, a *forwardAttempt, info node.LeaderInfo, followLeader bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if followLeader {
		stop := f.watch.onChange(info, func() { cancel(errLeaderChanged) })
		defer stop()
	}
	ctx = context.WithValue(ctx, forwardAttemptKey{}, a)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		// A new connection attempt: the transport only starts over for a
		// write when nothing of it was written.
		GetConn:      func(string) { a.sent.Store(false) },
		WroteHeaders: func() { a.sent.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) { a.sent.Store(true) },
	})
	f.proxy.ServeHTTP(w, r.WithContext(ctx))
	if a.err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return a.err
}

// waitOf is the wait_ms of an acquire body (0 if it has none or is not
// valid: the leader refuses it then).
func waitOf(body []byte) time.Duration {
	var b struct {
		WaitMS int64 `json:"wait_ms"`
	}
	if json.Unmarshal(body, &b) != nil || b.WaitMS <= 0 {
		return 0
	}
	const most = 24 * time.Hour
	if b.WaitMS > most.Milliseconds() {
		return most
	}
	return time.Duration(b.WaitMS) * time.Millisecond
}

// leaderWatch looks at who leads while forwards are in flight (one poller
// for all of them) and tells each forward when its leader lost its place.
type leaderWatch struct {
	loc   Locator
	every time.Duration

	mu      sync.Mutex
	subs    map[*leaderSub]struct{}
	running bool
}

type leaderSub struct {
	leader node.LeaderInfo
	fire   func()
}

// replaced reports whether now names another leader than was: another
// node (even one whose HTTP address is not known yet), or another address.
func replaced(was node.LeaderInfo, now node.LeaderInfo, ok bool) bool {
	return now.ID != "" && now.ID != was.ID || ok && now.HTTPAddr != was.HTTPAddr
}

// onChange calls fire once when another node than leader leads; stop ends
// the watch.
func (lw *leaderWatch) onChange(leader node.LeaderInfo, fire func()) (stop func()) {
	sub := &leaderSub{leader: leader, fire: fire}
	lw.mu.Lock()
	if lw.subs == nil {
		lw.subs = make(map[*leaderSub]struct{})
	}
	lw.subs[sub] = struct{}{}
	if !lw.running {
		lw.running = true
		go lw.poll()
	}
	lw.mu.Unlock()
	return func() {
		lw.mu.Lock()
		delete(lw.subs, sub)
		lw.mu.Unlock()
	}
}

// poll runs while anyone watches.
func (lw *leaderWatch) poll() {
	t := time.NewTicker(lw.every)
	defer t.Stop()
	for range t.C {
		info, ok := lw.loc.Leader()
		var fire []func()
		lw.mu.Lock()
		for sub := range lw.subs {
			if replaced(sub.leader, info, ok) {
				fire = append(fire, sub.fire)
				delete(lw.subs, sub)
			}
		}
		if len(lw.subs) == 0 {
			lw.running = false
			lw.mu.Unlock()
			for _, f := range fire {
				f()
			}
			return
		}
		lw.mu.Unlock()
		for _, f := range fire {
			f()
		}
	}
}

// next waits until a known leader other than was leads, at most pause (or
// until ctx ends), and returns the leader of the moment; ok is false when
// none is known.
func (lw *leaderWatch) next(ctx context.Context, was node.LeaderInfo, pause time.Duration) (node.LeaderInfo, bool) {
	t := time.NewTimer(pause)
	defer t.Stop()
	tick := time.NewTicker(lw.every)
	defer tick.Stop()
	for {
		info, ok := lw.loc.Leader()
		if ok && (info.Self || info.HTTPAddr != "") && replaced(was, info, ok) {
			return info, true
		}
		select {
		case <-ctx.Done():
			return node.LeaderInfo{}, false
		case <-t.C:
			return info, ok && (info.Self || info.HTTPAddr != "")
		case <-tick.C:
		}
	}
}

// tlsRefused reports a TLS handshake with the leader that failed: this node
// refused the leader's certificate, or the leader refused this node's. Either
// way the request was not applied. (TLS 1.3 reports the second after the
// client's handshake: when the request's write fails first, the answer is
// the cautious INDETERMINATE.)
func tlsRefused(err error) bool {
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) {
		return true
	}
	// The leader's alert arrives as a net.OpError "remote error" (its
	// alert type is crypto/tls's own): only the handshake alerts count.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil {
		msg := op.Err.Error()
		for _, s := range []string{"certificate", "handshake failure", "protocol version", "access denied"} {
			if strings.Contains(msg, s) {
				return true
			}
		}
	}
	return false
}
