package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRouteTable: the route table is consistent with itself: one entry per
// method and path; a forwarded GET is a read (sent again on failure); a
// duplex route bounds its body by progress and its answer itself; only a
// mutating admin route is marked ungated.
func TestRouteTable(t *testing.T) {
	s := New(newFake(), Options{}).(*server)
	s.control = &Control{}
	seen := map[string]bool{}
	for _, rt := range s.allRoutes() {
		name := rt.method + " " + rt.path
		if seen[name] {
			t.Errorf("%s: twice in the table", name)
		}
		seen[name] = true
		if rt.fwd.forward && rt.method == http.MethodGet && !rt.fwd.read {
			t.Errorf("%s: a forwarded GET not forwarded as a read", name)
		}
		if !rt.fwd.forward && rt.fwd != serveHere {
			t.Errorf("%s: a forward plan for a route served here", name)
		}
		if rt.fwd.waitBudget && !rt.fwd.bufferBody {
			t.Errorf("%s: the wait budget needs the body read first", name)
		}
		if rt.flags&duplex != 0 && rt.flags&(longAnswer|progressBody) != longAnswer|progressBody {
			t.Errorf("%s: duplex, but its body or its answer has a deadline for the whole", name)
		}
		if rt.flags&ungated != 0 && (rt.method == http.MethodGet || rt.scope(httptest.NewRequest(rt.method, "/", nil)) != ScopeAdmin) {
			t.Errorf("%s: ungated, but not a mutating admin route", name)
		}
	}
}
