package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// gatedFake is a fake node whose service gate refuses (a diverged
// server, say).
type gatedFake struct {
	*fakeNode
	gate error
}

func (g gatedFake) Gate() error { return g.gate }

// gateRequest is a request of rt with its path parameters filled in.
func gateRequest(rt route) (*http.Request, httprouter.Params) {
	var ps httprouter.Params
	var path []string
	for _, seg := range strings.Split(rt.path, "/") {
		switch {
		case strings.HasPrefix(seg, ":"):
			ps = append(ps, httprouter.Param{Key: seg[1:], Value: "x1"})
			seg = "x1"
		case strings.HasPrefix(seg, "*"):
			ps = append(ps, httprouter.Param{Key: seg[1:], Value: "/index.html"})
			seg = "index.html"
		}
		path = append(path, seg)
	}
	return httptest.NewRequest(rt.method, strings.Join(path, "/"), nil), ps
}

// TestServiceGateOnEveryRoute: while the node's gate refuses (its state
// diverged), every route of the table, the control lease's socket and
// status included, answers 503 OUT_OF_SERVICE with the service state and
// the reason, before its handler or a forward runs; health, readiness,
// metrics, local state, the membership repairs and the console's files
// are still served. With the gate open, no route answers OUT_OF_SERVICE.
func TestServiceGateOnEveryRoute(t *testing.T) {
	refusal := &wire.Error{Code: wire.CodeOutOfService, ServiceState: string(node.ServiceDiverged),
		Message: "this server is out of service (diverged): its state differs from the cluster's"}
	open := map[string]bool{
		"GET /healthz": true, "GET /readyz": true, "GET /metrics": true, "GET /v1/cluster/local": true,
		"DELETE /v1/cluster/members/:id": true, "POST /v1/cluster/transfer-leadership": true,
		"GET /": true, "GET /ui": true, "GET " + uiPrefix + "*file": true, "GET /v1/whoami": true, "GET /v1/openapi.json": true,
	}
	for _, gate := range []error{refusal, nil} {
		f := newFake()
		s := New(gatedFake{fakeNode: f, gate: gate}, Options{}).(*server)
		s.control = &Control{}
		routes := s.allRoutes()
		if len(routes) < 30 {
			t.Fatalf("%d routes", len(routes))
		}
		for _, rt := range routes {
			name := rt.method + " " + rt.path
			if open[name] != (rt.flags&anyState != 0) {
				t.Errorf("%s: anyState is %v", name, rt.flags&anyState != 0)
			}
			if gate == nil {
				// Open: nothing refuses (the handlers themselves are
				// other tests'; an event stream would not end here).
				if err := s.serviceGated(rt); err != nil {
					t.Errorf("%s: refused with the gate open: %v", name, err)
				}
				continue
			}
			req, ps := gateRequest(rt)
			rec := httptest.NewRecorder()
			w := &responseWriter{ResponseWriter: rec, n: s.n}
			if !open[name] || rt.path == "/healthz" || rt.path == "/readyz" || rt.path == "/v1/cluster/local" {
				s.wrap(rt, &routeLabels{method: rt.method, path: rt.path})(w, req, ps)
			} else if err := s.serviceGated(rt); err != nil {
				t.Errorf("%s: refused: %v", name, err)
			}
			refused := rec.Code == http.StatusServiceUnavailable && strings.Contains(rec.Body.String(), `"OUT_OF_SERVICE"`)
			switch {
			case open[name] && refused:
				t.Errorf("%s: refused, but an operator needs it: %s", name, rec.Body)
			case !open[name]:
				if !refused {
					t.Errorf("%s: %d %s, want 503 OUT_OF_SERVICE", name, rec.Code, rec.Body)
					continue
				}
				e := errorOf(t, rec)
				if e.ServiceState != "diverged" || !strings.Contains(e.Message, "differs from the cluster's") || rec.Header().Get("Retry-After") == "" {
					t.Errorf("%s: refusal %+v (Retry-After %q)", name, e, rec.Header().Get("Retry-After"))
				}
			}
		}
		if gate != nil {
			for _, c := range f.called() {
				switch c.method {
				case "HealthErr", "ReadyErr", "LocalState", "RemoveMember", "TransferLeadership", "Stats", "AppliedIndex", "Leader", "NodeID":
				default:
					t.Errorf("the node's %s was called while out of service", c.method)
				}
			}
		}
	}
}
