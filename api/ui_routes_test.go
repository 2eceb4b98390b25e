package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestUIFiles: the console's files are served without a token even when
// auth is on, with their content types and a strict CSP; GET / leads to
// them; the data routes keep their auth.
func TestUIFiles(t *testing.T) {
	h := New(newFake(), Options{Tokens: testTokens(t)})
	for _, tt := range []struct{ path, ctype, contains string }{
		{"/ui/", "text/html", `<script src="app.js"`},
		{"/ui/app.js", "text/javascript", "/v1/events"},
		{"/ui/style.css", "text/css", "@media"},
	} {
		rec := do(t, h, "GET", tt.path, "")
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), tt.ctype) ||
			!strings.Contains(rec.Body.String(), tt.contains) {
			t.Fatalf("GET %s: %d %q", tt.path, rec.Code, rec.Header().Get("Content-Type"))
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Fatalf("GET %s: CSP %q", tt.path, csp)
		}
	}
	for _, p := range []string{"/", "/ui"} {
		rec := do(t, h, "GET", p, "")
		if rec.Code != http.StatusFound || rec.Header().Get("Location") != "/ui/" {
			t.Fatalf("GET %s: %d to %q, want 302 to /ui/", p, rec.Code, rec.Header().Get("Location"))
		}
	}
	if rec := do(t, h, "GET", "/ui/nothing.js", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("GET /ui/nothing.js: %d", rec.Code)
	}
	if rec := do(t, h, "GET", "/v1/leases", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/leases without a token: %d, want 401", rec.Code)
	}
}

// TestWhoami: the name and scope of the presented token, never the token;
// admin when auth is off; 401 for an unknown one.
func TestWhoami(t *testing.T) {
	h := New(newFake(), Options{Tokens: testTokens(t)})
	for _, tt := range []struct{ token, want string }{
		{readToken, `{"auth":true,"name":"reader","scope":"read"}`},
		{writeToken, `{"auth":true,"name":"worker","scope":"write"}`},
		{adminToken, `{"auth":true,"name":"ops","scope":"admin"}`},
	} {
		rec := do(t, h, "GET", "/v1/whoami", "", "Authorization", "Bearer "+tt.token)
		if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != tt.want {
			t.Fatalf("whoami: %d %s, want %s", rec.Code, rec.Body, tt.want)
		}
	}
	rec := do(t, h, "GET", "/v1/whoami", "", "Authorization", "Bearer not-a-token")
	wantError(t, rec, http.StatusUnauthorized, wire.CodeUnauthenticated, "")
	rec = do(t, New(newFake(), Options{}), "GET", "/v1/whoami", "")
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"auth":false,"scope":"admin"}` {
		t.Fatalf("whoami without auth: %d %s", rec.Code, rec.Body)
	}
}

// TestUINeverForwarded: a follower serves the console and whoami itself.
func TestUINeverForwarded(t *testing.T) {
	uncheckedExchanges(t) // a fake leader's teapot passes through
	var mu sync.Mutex
	var reached []string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reached = append(reached, r.URL.Path)
		mu.Unlock()
		http.Error(w, "the leader was asked", http.StatusTeapot)
	}))
	defer leader.Close()
	f := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{})
	for _, p := range []string{"/", "/ui", "/ui/", "/ui/app.js", "/v1/whoami"} {
		if rec := do(t, h, "GET", p, ""); rec.Code != http.StatusOK && rec.Code != http.StatusFound {
			t.Fatalf("GET %s on a follower: %d %s", p, rec.Code, rec.Body)
		}
	}
	// The data routes are still forwarded (the check's own control).
	if rec := do(t, h, "GET", "/v1/leases", ""); rec.Code != http.StatusTeapot {
		t.Fatalf("GET /v1/leases on a follower: %d, want the leader's answer", rec.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reached) != 1 || reached[0] != "/v1/leases" {
		t.Fatalf("forwarded to the leader: %q", reached)
	}
}
