package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// Helpers of the use-case tests (usecase_*_test.go): each plays one of the
// systems of docs/use-cases.md against a real node through the HTTP API.

// useCaseTick is the tick period of the use-case tests' nodes.
const useCaseTick = 20 * time.Millisecond

// useCaseEnv is a real single node (in memory) behind the HTTP API.
type useCaseEnv struct {
	t   *testing.T
	n   *node.Node
	h   http.Handler
	srv *httptest.Server // for event streams
}

// newUseCaseEnv opens a node with 20 ms ticks and TTLs from 100 ms (then
// changed by each of tweak), serves the API with opts, and waits until it is
// ready.
func newUseCaseEnv(t *testing.T, opts Options, tweak ...func(*node.Config)) *useCaseEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.TickPeriod = useCaseTick
	cfg.MinTTL = 100 * time.Millisecond
	for _, f := range tweak {
		f(&cfg)
	}
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &useCaseEnv{t: t, n: n, h: New(FromNode(n), opts)}
	e.srv = httptest.NewServer(e.h)
	// Cleanups run last-registered first: the server closes before the node.
	t.Cleanup(func() { n.Close() })
	t.Cleanup(e.srv.Close)
	pollUntil(t, 10*time.Second, "the node to be ready", func() bool {
		return e.call("GET", "/readyz", "").Code == 200 &&
			e.call("GET", "/v1/leases", "", "Authorization", "Bearer "+adminToken).Code == 200
	})
	return e
}

// call sends one request; hdr lists header name, value pairs.
func (e *useCaseEnv) call(method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	e.t.Helper()
	return do(e.t, e.h, method, target, body, hdr...)
}

// lease sends a request that must answer status with a lease, and returns it.
func (e *useCaseEnv) lease(status int, method, target, body string, hdr ...string) wire.Lease {
	e.t.Helper()
	rec := e.call(method, target, body, hdr...)
	if rec.Code != status {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, target, rec.Code, status, rec.Body)
	}
	var l wire.Lease
	jsonOf(e.t, rec, &l)
	return l
}

// session sends a request that must answer status with a session.
func (e *useCaseEnv) session(status int, method, target, body string, hdr ...string) wire.Session {
	e.t.Helper()
	rec := e.call(method, target, body, hdr...)
	if rec.Code != status {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, target, rec.Code, status, rec.Body)
	}
	var s wire.Session
	jsonOf(e.t, rec, &s)
	return s
}

// list returns the leases a listing query (after "/v1/leases?") selects,
// following pages.
func (e *useCaseEnv) list(query string, hdr ...string) []*wire.Lease {
	e.t.Helper()
	var out []*wire.Lease
	after := ""
	for range 100 {
		target := "/v1/leases?" + query
		if after != "" {
			target += "&after=" + after
		}
		rec := e.call("GET", target, "", hdr...)
		if rec.Code != 200 {
			e.t.Fatalf("list %s: %d %s", query, rec.Code, rec.Body)
		}
		var page wire.LeaseList
		jsonOf(e.t, rec, &page)
		out = append(out, page.Leases...)
		if page.Next == "" {
			return out
		}
		after = page.Next
	}
	e.t.Fatalf("list %s: more than 100 pages", query)
	return nil
}

// metrics returns the /metrics samples.
func (e *useCaseEnv) metrics() map[string]float64 {
	e.t.Helper()
	rec := e.call("GET", "/metrics", "")
	if rec.Code != 200 {
		e.t.Fatalf("metrics: %d", rec.Code)
	}
	return parseExposition(e.t, rec.Body.String())
}
