package api

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/leasehold/leasehold/node"
)

// headerForwarded marks a request a follower forwarded to the leader; the
// leader answers it itself and never forwards it again (if leadership moved
// in between, the answer is NO_LEADER and the client retries).
const headerForwarded = "X-Leasehold-Forwarded-By"

// leaderLocator is implemented by nodes that can name the leader's HTTP
// address (*node.Node through FromNode). Without it nothing is forwarded.
type leaderLocator interface {
	Leader() (node.LeaderInfo, bool)
}

// forwarder proxies requests from a follower to the leader.
type forwarder struct {
	proxy *httputil.ReverseProxy
	tls   bool // forward over https
}

func newForwarder(log interface {
	Warn(msg string, args ...any)
}, tlsConf *tls.Config, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *forwarder {
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
	}
	f := &forwarder{tls: tlsConf != nil}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			target := pr.In.Context().Value(forwardTargetKey{}).(*url.URL)
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1, // event streams and long waits pass through at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status, e := forwardErrorStatus(r, err)
			log.Warn("forwarding to the leader failed", "method", r.Method, "path", r.URL.Path, "err", err)
			writeErrorBody(w, status, e)
		},
	}
	return f
}

type forwardTargetKey struct{}

// forwardErrorStatus turns a failed forward into the contract's answer:
// NO_LEADER when the request certainly did not reach the leader (it could
// not be dialled) or was a read; INDETERMINATE when a write may have
// reached it.
func forwardErrorStatus(r *http.Request, err error) (int, *node.Error) {
	var op *net.OpError
	dialFailed := errors.As(err, &op) && op.Op == "dial" || tlsRefused(err)
	if dialFailed || r.Method == http.MethodGet || errors.Is(err, context.Canceled) && r.Context().Err() != nil && r.Method == http.MethodGet {
		return http.StatusServiceUnavailable, &node.Error{Code: node.CodeNoLeader,
			Message: "the leader could not be reached: " + err.Error()}
	}
	return http.StatusGatewayTimeout, &node.Error{Code: node.CodeIndeterminate,
		Message: "the connection to the leader failed while the request was in flight; it may or may not have been applied: " + err.Error()}
}

// forwardable says whether a route's requests go to the leader when this
// node is a follower: every write and every linearizable read. The event
// stream, health, readiness, metrics and local state are this node's own, and
// ?stale=true reads answer locally.
func forwardable(rt route, r *http.Request) bool {
	switch rt.path {
	case "/v1/events", "/v1/cluster/local", "/healthz", "/readyz", "/metrics", "/v1/control/ws":
		return false
	}
	if r.Method == http.MethodGet && isTrue(r.URL.Query().Get("stale")) {
		return false
	}
	return true
}

func isTrue(s string) bool { return s == "true" || s == "1" }

// maybeForward proxies r to the leader when this node is a follower that
// knows the leader's HTTP address, and reports whether it did.
func (s *server) maybeForward(w http.ResponseWriter, r *http.Request, rt route) bool {
	if s.fwd == nil || r.Header.Get(headerForwarded) != "" || !forwardable(rt, r) {
		return false
	}
	info, ok := s.locator.Leader()
	if !ok || info.Self || info.HTTPAddr == "" {
		return false
	}
	target := &url.URL{Scheme: "http", Host: info.HTTPAddr}
	if r.TLS != nil || s.fwd.tls {
		target.Scheme = "https"
	}
	r = r.WithContext(context.WithValue(r.Context(), forwardTargetKey{}, target))
	r.Header.Set(headerForwarded, s.nodeID())
	if rw, ok := w.(*responseWriter); ok {
		rw.forwarded = true
	}
	s.fwd.proxy.ServeHTTP(w, r)
	return true
}

func (s *server) nodeID() string {
	if st, ok := s.n.(interface{ NodeID() string }); ok {
		return st.NodeID()
	}
	return "follower"
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
