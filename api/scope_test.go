package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// Scoped tokens (scope.go, scoped.go): the tokens file syntax, the access
// decisions, and, against a real node, every route tried by another
// tenant's token.

const (
	tenantAToken  = "tenant-a-secret-0123456789"
	tenantBToken  = "tenant-b-secret-0123456789"
	observerToken = "b-observer-secret-0123456789"
	bKeysToken    = "b-keys-secret-0123456789"
)

// scopedTokens: an admin, an unrestricted reader and writer (as
// testTokens), two tenants that write their own key prefix as their own
// holders, an observer that writes b/ as holder b-obs and reads a/, and a
// token that writes b/ as any holder.
func scopedTokens(t *testing.T) *Tokens {
	t.Helper()
	data := fmt.Sprintf(`{"tokens":[
		{"name":"ops","sha256":%q,"scopes":["admin"]},
		{"name":"reader","sha256":%q,"scopes":["read"]},
		{"name":"worker","sha256":%q,"scopes":["write"]},
		{"name":"tenant-a","sha256":%q,"scopes":["write"],"keys":{"write":["a/"]},"holders":{"prefixes":["a-"]}},
		{"name":"tenant-b","sha256":%q,"scopes":["write"],"keys":{"write":["b/"]},"holders":{"prefixes":["b-"]}},
		{"name":"b-observer","sha256":%q,"scopes":["write"],"keys":{"read":["a/"],"write":["b/"]},"holders":{"names":["b-obs"]}},
		{"name":"b-keys","sha256":%q,"scopes":["write"],"keys":{"write":["b/"]}}]}`,
		HashToken(adminToken), HashToken(readToken), HashToken(writeToken),
		HashToken(tenantAToken), HashToken(tenantBToken), HashToken(observerToken), HashToken(bKeysToken))
	tk, err := ParseTokens([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func bearer(token string) []string { return []string{"Authorization", "Bearer " + token} }

// tokensPlus is testTokens (reader, worker, ops) with more entries, each
// one JSON object of the tokens file's list.
func tokensPlus(t *testing.T, entries ...string) *Tokens {
	t.Helper()
	data := fmt.Sprintf(`{"tokens":[
		{"name":"reader","sha256":%q,"scopes":["read"]},
		{"name":"worker","sha256":%q,"scopes":["read","write"]},
		{"name":"ops","sha256":%q,"scopes":["admin"]}`,
		HashToken(readToken), HashToken(writeToken), HashToken(adminToken))
	for _, e := range entries {
		data += ",\n" + e
	}
	tk, err := ParseTokens([]byte(data + "]}"))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestParseScopedTokens(t *testing.T) {
	h := HashToken("x")
	entry := func(scopes, extra string) string {
		return `{"tokens":[{"name":"t","sha256":"` + h + `","scopes":[` + scopes + `]` + extra + `}]}`
	}
	t.Run("unrestricted entries are as before", func(t *testing.T) {
		tk := testTokens(t)
		for _, e := range tk.entries() {
			if e.acc != nil {
				t.Errorf("token %q has restrictions %+v", e.name, e.acc)
			}
		}
	})
	t.Run("scoped", func(t *testing.T) {
		tk, err := ParseTokens([]byte(entry(`"write"`, `,"keys":{"read":["s/","s/"],"write":["t/"]},"holders":{"names":["w1"],"prefixes":["t-"]}`)))
		if err != nil {
			t.Fatal(err)
		}
		a := tk.entries()[0].acc
		for _, c := range []struct {
			got, want bool
			what      string
		}{
			{a.canRead("s/1"), true, "read s/1"}, {a.canWrite("s/1"), false, "write s/1"},
			{a.canRead("t/1"), true, "read t/1 (write implies read)"}, {a.canWrite("t/1"), true, "write t/1"},
			{a.canRead("u/1"), false, "read u/1"}, {a.canRead("t"), false, "read t"},
			{a.canHold("w1"), true, "hold w1"}, {a.canHold("w10"), false, "hold w10 (names are exact)"},
			{a.canHold("t-9"), true, "hold t-9"}, {a.canHold("x"), false, "hold x"},
		} {
			if c.got != c.want {
				t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
			}
		}
		if got := a.view().Keys.Read; len(got) != 1 {
			t.Errorf("duplicates kept: %q", got)
		}
	})
	t.Run("keys only, holders only", func(t *testing.T) {
		tk, err := ParseTokens([]byte(entry(`"read"`, `,"keys":{"read":[""]}`)))
		if err != nil {
			t.Fatal(err)
		}
		if a := tk.entries()[0].acc; !a.canRead("anything") || a.holderScoped() {
			t.Errorf("read-everything token: %+v", a)
		}
		tk, err = ParseTokens([]byte(entry(`"write"`, `,"holders":{"names":["w"]}`)))
		if err != nil {
			t.Fatal(err)
		}
		if a := tk.entries()[0].acc; !a.canWrite("any/key") || a.keyScoped() || !a.holderScoped() || a.canHold("v") {
			t.Errorf("holder-only token: %+v", a)
		}
	})
	for _, tt := range []struct {
		name, data, want string
	}{
		{"admin restricted", entry(`"admin"`, `,"keys":{"read":["a/"]}`), "an admin token cannot be restricted"},
		{"admin with holders", entry(`"read","admin"`, `,"holders":{"names":["w"]}`), "an admin token cannot be restricted"},
		{"keys null", entry(`"read"`, `,"keys":null`), `"keys" must be an object`},
		{"keys a list", entry(`"read"`, `,"keys":["a/"]`), `"keys" must be an object`},
		{"keys empty", entry(`"read"`, `,"keys":{}`), `"keys" lists no prefix`},
		{"keys unknown field", entry(`"read"`, `,"keys":{"reads":["a/"]}`), `unknown field "reads"`},
		{"write prefixes on a read token", entry(`"read"`, `,"keys":{"write":["a/"]}`), `"keys.write" needs the write scope`},
		{"control character", entry(`"read"`, `,"keys":{"read":["a/\u0007"]}`), "control character"},
		{"long prefix", entry(`"read"`, `,"keys":{"read":["`+strings.Repeat("k", 513)+`"]}`), "at most 512 bytes"},
		{"holders null", entry(`"write"`, `,"holders":null`), `"holders" must be an object`},
		{"holders empty", entry(`"write"`, `,"holders":{"names":[],"prefixes":[]}`), `"holders" lists no name`},
		{"empty holder name", entry(`"write"`, `,"holders":{"names":[""]}`), "must not be empty"},
		{"empty holder prefix", entry(`"write"`, `,"holders":{"prefixes":[""]}`), "would match every holder"},
		{"long holder", entry(`"write"`, `,"holders":{"names":["`+strings.Repeat("h", 129)+`"]}`), "at most 128 bytes"},
		{"holders unknown field", entry(`"write"`, `,"holders":{"name":["w"]}`), `unknown field "name"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tk, err := ParseTokens([]byte(tt.data))
			if err == nil || tk != nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `token "t"`) {
				t.Fatalf("err = %v, want it to name the token and contain %q", err, tt.want)
			}
		})
	}
}

func TestHiddenID(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"ls_0123456789abcdef", "ls_fedcba9876543210", "ss_0000000000000000", "cl_00ff00ff00ff00ff", "ls_0123456789abcdee"} {
		h := hiddenID(id)
		if len(h) != len(id) || h[:3] != id[:3] || h == id {
			t.Errorf("hiddenID(%q) = %q", id, h)
		}
		if strings.ContainsAny(h[3:], "0123456789abcdef") {
			t.Errorf("hiddenID(%q) = %q keeps hex digits", id, h)
		}
		if other, dup := seen[h]; dup {
			t.Errorf("hiddenID(%q) = hiddenID(%q)", id, other)
		}
		seen[h] = id
	}
}

func TestNarrowLeases(t *testing.T) {
	a := &access{keys: &keyAccess{read: []string{"shared/"}, write: []string{"t/x/", "t/y/"}}}
	for _, tt := range []struct {
		req        wire.ListRequest
		wantPrefix string
		wantKey    string
		some       bool
	}{
		{wire.ListRequest{}, "", "", true},                                 // several prefixes: filtered after
		{wire.ListRequest{Prefix: "t/"}, "t/", "", true},                   // t/x/ and t/y/ share t/
		{wire.ListRequest{Prefix: "t/x"}, "t/x/", "", true},                // narrowed to the one under it
		{wire.ListRequest{Prefix: "t/x/1"}, "t/x/1", "", true},             // all readable
		{wire.ListRequest{Prefix: "u/"}, "u/", "", false},                  // nothing readable
		{wire.ListRequest{Key: "shared/k"}, "", "shared/k", true},          // readable key
		{wire.ListRequest{Key: "t/z/k"}, "", "t/z/k", false},               // unreadable key
		{wire.ListRequest{Prefix: "sh", Holder: "h"}, "shared/", "", true}, // other filters kept
	} {
		got, some := a.narrowLeases(tt.req)
		if some != tt.some || (some && (got.Prefix != tt.wantPrefix || got.Key != tt.wantKey || got.Holder != tt.req.Holder)) {
			t.Errorf("narrowLeases(%+v) = %+v, %v", tt.req, got, some)
		}
	}
	var none *access
	if got, some := none.narrowLeases(wire.ListRequest{Prefix: "p"}); !some || got.Prefix != "p" {
		t.Errorf("unrestricted: %+v %v", got, some)
	}
}

// scopedEnv is a real node behind the API with scopedTokens, where tenant
// A holds a standalone lease, a session with a bound lease, and an ended
// lease, and tenant B a lease of its own.
type scopedEnv struct {
	*useCaseEnv
	aLease, aBound, aEnded, bLease wire.Lease
	aSession                       wire.Session
}

func newScopedEnv(t *testing.T) *scopedEnv {
	e := &scopedEnv{useCaseEnv: newUseCaseEnv(t, Options{Tokens: scopedTokens(t)})}
	A := bearer(tenantAToken)
	e.aLease = e.lease(201, "POST", "/v1/leases", `{"key":"a/job-1","holder":"a-w1","ttl_ms":60000,"metadata":{"site":"a-site"}}`, A...)
	e.aSession = e.session(201, "POST", "/v1/sessions", `{"holder":"a-w1","ttl_ms":60000}`, A...)
	e.aBound = e.lease(201, "POST", "/v1/leases", `{"key":"a/job-2","session_id":"`+e.aSession.SessionID+`"}`,
		append(A, "X-Session-Token", e.aSession.Token)...)
	e.aEnded = e.lease(201, "POST", "/v1/leases", `{"key":"a/job-3","holder":"a-w1","ttl_ms":60000}`, A...)
	e.lease(200, "DELETE", "/v1/leases/"+e.aEnded.LeaseID, "", append(A, "X-Lease-Token", e.aEnded.Token)...)
	e.bLease = e.lease(201, "POST", "/v1/leases", `{"key":"b/job-1","holder":"b-w1","ttl_ms":60000}`, bearer(tenantBToken)...)
	return e
}

// aSecrets are the names of tenant A's objects: none may appear in an
// answer to tenant B.
func (e *scopedEnv) aSecrets() []string {
	return []string{"a/job", "a-w1", "a-site", e.aLease.LeaseID, e.aBound.LeaseID, e.aEnded.LeaseID, e.aSession.SessionID}
}

// missingLike returns an id of the same kind and length as id that no
// object has.
func missingLike(id string) string {
	return id[:3] + strings.Repeat("0", len(id)-4) + "1"
}

// sameAnswer checks that the answer about tenant A's object (named hid)
// is the answer about a missing one (named mid), but for the id.
func sameAnswer(t *testing.T, what string, got, want *httptest.ResponseRecorder, hid, mid string) {
	t.Helper()
	gb := strings.ReplaceAll(got.Body.String(), hid, mid)
	if got.Code != want.Code || gb != want.Body.String() || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
		t.Errorf("%s: the answer tells an existing object from a missing one:\n existing: %d %s\n  missing: %d %s",
			what, got.Code, got.Body, want.Code, want.Body)
	}
}

func (e *scopedEnv) noSecrets(t *testing.T, what, body string) {
	t.Helper()
	for _, s := range e.aSecrets() {
		if strings.Contains(body, s) {
			t.Errorf("%s: answer shows %q: %s", what, s, body)
		}
	}
}

// TestScopedTokensOtherTenant tries every route with tenant B's token on
// tenant A's objects: each answer is the answer for a missing object (or a
// 403 decided from the request alone), shows nothing of A's, and changes
// nothing; then A's objects are exactly as they were.
func TestScopedTokensOtherTenant(t *testing.T) {
	e := newScopedEnv(t)
	B := bearer(tenantBToken)
	before := e.list("prefix=a/", bearer(adminToken)...)

	// Routes that name an object by id: A's object and a missing one of
	// the same kind get the same answer.
	type idCase struct {
		name, method, path, body string
		hdr                      []string
		id                       string // the id in path or body
	}
	aL, aB, aS := e.aLease, e.aBound, e.aSession
	cases := []idCase{
		{"get lease", "GET", "/v1/leases/{id}", "", nil, aL.LeaseID},
		{"get lease stale", "GET", "/v1/leases/{id}?stale=true", "", nil, aL.LeaseID},
		{"get ended lease", "GET", "/v1/leases/{id}", "", nil, e.aEnded.LeaseID},
		{"get lease with A's lease token (its grant)", "GET", "/v1/leases/{id}", "", []string{"X-Lease-Token", aL.Token}, aL.LeaseID},
		{"get bound lease with A's session token (its grant)", "GET", "/v1/leases/{id}", "", []string{"X-Session-Token", aS.Token}, aB.LeaseID},
		{"renew with A's own token", "POST", "/v1/leases/{id}/renew", "", []string{"X-Lease-Token", aL.Token}, aL.LeaseID},
		{"renew with a wrong token", "POST", "/v1/leases/{id}/renew", `{"ttl_ms":5000}`, []string{"X-Lease-Token", "nope"}, aL.LeaseID},
		{"renew with a bad ttl", "POST", "/v1/leases/{id}/renew", `{"ttl_ms":1}`, []string{"X-Lease-Token", aL.Token}, aL.LeaseID},
		{"renew metadata of a bound lease", "POST", "/v1/leases/{id}/renew", `{"metadata":{"x":"y"}}`, []string{"X-Lease-Token", aB.Token}, aB.LeaseID},
		{"renew an ended lease", "POST", "/v1/leases/{id}/renew", "", []string{"X-Lease-Token", e.aEnded.Token}, e.aEnded.LeaseID},
		{"release with A's own token", "DELETE", "/v1/leases/{id}", "", []string{"X-Lease-Token", aL.Token}, aL.LeaseID},
		{"release with a bad reason", "DELETE", "/v1/leases/{id}", `{"reason":"` + strings.Repeat("r", 300) + `"}`, []string{"X-Lease-Token", aL.Token}, aL.LeaseID},
		{"release bound with A's session token", "DELETE", "/v1/leases/{id}", "", []string{"X-Session-Token", aS.Token}, aB.LeaseID},
		{"validate with A's own token", "POST", "/v1/validate", `{"lease_id":"{id}","token":"` + aL.Token + `"}`, nil, aL.LeaseID},
		{"validate with a wrong token", "POST", "/v1/validate", `{"lease_id":"{id}","token":"nope"}`, nil, aL.LeaseID},
		{"get session", "GET", "/v1/sessions/{id}", "", nil, aS.SessionID},
		{"get session stale", "GET", "/v1/sessions/{id}?stale=true", "", nil, aS.SessionID},
		{"session heartbeat with A's own token", "POST", "/v1/sessions/{id}/heartbeat", "", []string{"X-Session-Token", aS.Token}, aS.SessionID},
		{"end session with A's own token", "DELETE", "/v1/sessions/{id}", "", []string{"X-Session-Token", aS.Token}, aS.SessionID},
		{"acquire bound to A's session", "POST", "/v1/leases", `{"key":"b/x","session_id":"{id}"}`, []string{"X-Session-Token", aS.Token}, aS.SessionID},
		{"acquire bound to A's session as B", "POST", "/v1/leases", `{"key":"b/x","holder":"b-w1","session_id":"{id}"}`, []string{"X-Session-Token", aS.Token}, aS.SessionID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mid := missingLike(c.id)
			send := func(id string) *httptest.ResponseRecorder {
				path := strings.ReplaceAll(c.path, "{id}", id)
				body := strings.ReplaceAll(c.body, "{id}", id)
				return e.call(c.method, path, body, append(append([]string{}, B...), c.hdr...)...)
			}
			got, want := send(c.id), send(mid)
			if got.Code < 400 && !strings.Contains(got.Body.String(), `"valid":false`) {
				t.Fatalf("tenant B reached A's object: %d %s", got.Code, got.Body)
			}
			sameAnswer(t, c.name, got, want, c.id, mid)
			e.noSecrets(t, c.name, strings.ReplaceAll(got.Body.String(), c.id, mid))
		})
	}

	t.Run("heartbeat", func(t *testing.T) {
		body := `{"leases":[{"lease_id":%q,"token":%q},{"lease_id":%q,"token":%q},{"lease_id":%q,"token":%q}]}`
		mid := missingLike(aL.LeaseID)
		rec := e.call("POST", "/v1/heartbeat", fmt.Sprintf(body, aL.LeaseID, aL.Token, mid, aL.Token, e.bLease.LeaseID, e.bLease.Token), B...)
		if rec.Code != 200 {
			t.Fatalf("heartbeat: %d %s", rec.Code, rec.Body)
		}
		var ans heartbeatAnswer
		jsonOf(t, rec, &ans)
		if len(ans.Results) != 3 || !ans.Results[2].OK || ans.Results[0].OK || ans.Results[1].OK {
			t.Fatalf("results %+v", ans.Results)
		}
		r0, _ := json.Marshal(ans.Results[0])
		r1, _ := json.Marshal(ans.Results[1])
		if strings.ReplaceAll(string(r0), aL.LeaseID, mid) != string(r1) {
			t.Errorf("A's lease %s and a missing one %s are answered differently", r0, r1)
		}
	})

	t.Run("keep-alive stream", func(t *testing.T) {
		ks, resp := openKeepAlive(t, e.srv.URL, tenantBToken)
		if ks == nil {
			t.Fatalf("stream refused: %d", resp.StatusCode)
		}
		mid := missingLike(aL.LeaseID)
		ks.send(t, fmt.Sprintf(`{"id":1,"lease_id":%q,"token":%q}`, aL.LeaseID, aL.Token))
		a1 := ks.next(t)
		ks.send(t, fmt.Sprintf(`{"id":1,"lease_id":%q,"token":%q}`, mid, aL.Token))
		a2 := ks.next(t)
		j1, _ := json.Marshal(a1)
		j2, _ := json.Marshal(a2)
		if a1.OK || strings.ReplaceAll(string(j1), aL.LeaseID, mid) != string(j2) {
			t.Errorf("A's lease %s and a missing one %s are answered differently", j1, j2)
		}
		ks.send(t, fmt.Sprintf(`{"id":2,"lease_id":%q,"token":%q}`, e.bLease.LeaseID, e.bLease.Token))
		if a := ks.next(t); !a.OK || a.ID != 2 {
			t.Errorf("B's own renewal: %+v", a)
		}
	})

	// Requests whose own content is A's (a key, a holder): 403 whether or
	// not A has anything there.
	for _, c := range []struct {
		name, method, path, body, other string
	}{
		{"acquire A's key", "POST", "/v1/leases", `{"key":"a/job-1","holder":"b-w1","ttl_ms":5000}`, `{"key":"a/nothing","holder":"b-w1","ttl_ms":5000}`},
		{"acquire as A's holder", "POST", "/v1/leases", `{"key":"b/k","holder":"a-w1","ttl_ms":5000}`, `{"key":"b/k","holder":"a-nobody","ttl_ms":5000}`},
		{"create a session as A's holder", "POST", "/v1/sessions", `{"holder":"a-w1","ttl_ms":5000}`, `{"holder":"a-nobody","ttl_ms":5000}`},
		{"validate A's key", "POST", "/v1/validate", `{"key":"a/job-1","fencing_token":1}`, `{"key":"a/nothing","fencing_token":1}`},
		{"release A's holder", "POST", "/v1/holders/a-w1/release", "", "/v1/holders/a-nobody/release"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := e.call(c.method, c.path, c.body, B...)
			var want *httptest.ResponseRecorder
			if strings.HasPrefix(c.other, "/") {
				want = e.call(c.method, c.other, c.body, B...)
			} else {
				want = e.call(c.method, c.path, c.other, B...)
			}
			wantError(t, got, 403, wire.CodePermissionDenied, "")
			wantError(t, want, 403, wire.CodePermissionDenied, "")
			e.noSecrets(t, c.name, strings.NewReplacer("a/job-1", "", "a-w1", "").Replace(got.Body.String()))
		})
	}

	// Listings are filtered, not refused.
	t.Run("listings", func(t *testing.T) {
		for _, q := range []string{"", "state=active", "prefix=a/", "prefix=a", "key=a/job-1", "holder=a-w1", "session_id=" + aS.SessionID, "prefix=b/", "limit=1"} {
			got := e.list(q, B...)
			for _, l := range got {
				if !strings.HasPrefix(l.Key, "b/") {
					t.Errorf("list %q shows %s on %q", q, l.LeaseID, l.Key)
				}
			}
			wantB := q == "" || q == "state=active" || q == "prefix=b/" || q == "limit=1"
			if wantB != (len(got) == 1) {
				t.Errorf("list %q: %d leases", q, len(got))
			}
		}
		for _, q := range []string{"", "?holder=a-w1", "?holder=b-w1"} {
			rec := e.call("GET", "/v1/sessions"+q, "", B...)
			if rec.Code != 200 {
				t.Fatalf("sessions %q: %d %s", q, rec.Code, rec.Body)
			}
			e.noSecrets(t, "sessions "+q, rec.Body.String())
		}
		// The node still checks the request.
		wantError(t, e.call("GET", "/v1/leases?prefix=a/&state=bogus", "", B...), 400, wire.CodeInvalidArgument, "state")
		wantError(t, e.call("GET", "/v1/leases?prefix=a/&limit=5000", "", B...), 400, wire.CodeInvalidArgument, "limit")
		wantError(t, e.call("GET", "/v1/sessions?holder=a-w1&limit=5000", "", B...), 400, wire.CodeInvalidArgument, "limit")
	})

	// Operator actions and the control lease stay admin-only.
	t.Run("operator routes", func(t *testing.T) {
		for _, r := range []struct{ method, path, body string }{
			{"POST", "/v1/leases/" + aL.LeaseID + "/revoke", `{"reason":"x"}`},
			{"POST", "/v1/leases/" + e.bLease.LeaseID + "/revoke", `{"reason":"x"}`},
			{"DELETE", "/v1/sessions/" + aS.SessionID, ""},
			{"GET", "/v1/cluster/local", ""},
			{"GET", "/v1/cluster/snapshot", ""},
			{"PUT", "/v1/cluster/snapshot", "x"},
			{"DELETE", "/v1/cluster/members/c9", ""},
			{"POST", "/v1/cluster/transfer-leadership", ""},
			{"POST", "/v1/control/break", ""},
			{"GET", "/v1/control/ws", ""},
		} {
			rec := e.call(r.method, r.path, r.body, B...)
			wantError(t, rec, 403, wire.CodePermissionDenied, "")
			e.noSecrets(t, r.path, rec.Body.String())
		}
	})

	after := e.list("prefix=a/", bearer(adminToken)...)
	if fmt.Sprint(leaseStates(before)) != fmt.Sprint(leaseStates(after)) {
		t.Errorf("tenant B's requests changed the leases:\n before %v\n  after %v", leaseStates(before), leaseStates(after))
	}
	s := e.session(200, "GET", "/v1/sessions/"+aS.SessionID, "", bearer(tenantAToken)...)
	if s.State != "active" || len(s.LeaseIDs) != 1 {
		t.Errorf("A's session after B's requests: %+v", s)
	}
}

// leaseStates is what a renewal, release or revoke would change.
func leaseStates(ls []*wire.Lease) []string {
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%s %s %s %s renewals=%d", l.LeaseID, l.Key, l.Holder, l.State, l.RenewalCount))
	}
	return out
}

// TestScopedTokensOwnTenant: a scoped token does all it needs within its
// scope; a token that reads a key but may not write it gets 403 on a
// write; a holder-scoped write token releases its own holder without
// admin, but not another; an unrestricted write token still cannot.
func TestScopedTokensOwnTenant(t *testing.T) {
	e := newScopedEnv(t)
	A, O := bearer(tenantAToken), bearer(observerToken)

	l := e.lease(200, "POST", "/v1/leases/"+e.aLease.LeaseID+"/renew", "", append(A, "X-Lease-Token", e.aLease.Token)...)
	if l.RenewalCount != 1 {
		t.Errorf("renewal: %+v", l)
	}
	if got := e.list("", A...); len(got) != 3 {
		t.Errorf("A lists %d leases, want its 3", len(got))
	}
	rec := e.call("GET", "/v1/whoami", "", A...)
	var who whoamiAnswer
	jsonOf(t, rec, &who)
	if !who.Restricted || who.Keys == nil || fmt.Sprint(who.Keys.Write) != "[a/]" || who.Holders == nil || fmt.Sprint(who.Holders.Prefixes) != "[a-]" {
		t.Errorf("whoami: %s", rec.Body)
	}

	// The observer reads a/ but writes only b/ as b-obs.
	if got := e.list("prefix=a/", O...); len(got) != 3 {
		t.Errorf("the observer lists %d leases of a/, want 3", len(got))
	}
	e.lease(200, "GET", "/v1/leases/"+e.aLease.LeaseID, "", O...)
	e.lease(200, "GET", "/v1/leases/"+e.bLease.LeaseID, "", O...) // b/ is readable: it writes there
	wantError(t, e.call("POST", "/v1/leases/"+e.aLease.LeaseID+"/renew", "", append(O, "X-Lease-Token", e.aLease.Token)...),
		403, wire.CodePermissionDenied, "")
	wantError(t, e.call("DELETE", "/v1/leases/"+e.bLease.LeaseID, "", append(O, "X-Lease-Token", e.bLease.Token)...),
		403, wire.CodePermissionDenied, "") // b/ is writable, but b-w1 is not its holder
	rec = e.call("POST", "/v1/validate", `{"key":"a/job-1","fencing_token":`+fmt.Sprint(e.aLease.FencingToken)+`}`, O...)
	var v wire.ValidateResult
	jsonOf(t, rec, &v)
	if !v.Valid {
		t.Errorf("the observer validates A's fencing token: %s", rec.Body)
	}
	// Sessions are the holder's: the observer sees none of A's, not even
	// the session id of A's bound lease, whose key it may read.
	wantError(t, e.call("GET", "/v1/sessions/"+e.aSession.SessionID, "", O...), 404, wire.CodeSessionNotFound, "")
	if l := e.lease(200, "GET", "/v1/leases/"+e.aBound.LeaseID, "", O...); l.SessionID != "" || l.Key != "a/job-2" {
		t.Errorf("A's bound lease as the observer sees it: %+v", l)
	}
	if got := e.list("session_id="+e.aSession.SessionID, O...); len(got) != 0 {
		t.Errorf("the observer lists %d leases of A's session", len(got))
	}
	// A token scoped to keys only sees every holder's sessions, but only
	// the leases of its keys in them.
	K := bearer(bKeysToken)
	if s := e.session(200, "GET", "/v1/sessions/"+e.aSession.SessionID, "", K...); len(s.LeaseIDs) != 0 {
		t.Errorf("A's session as b-keys sees it: %+v", s)
	}
	if s := e.session(200, "GET", "/v1/sessions/"+e.aSession.SessionID, "", A...); len(s.LeaseIDs) != 1 {
		t.Errorf("A's session as A sees it: %+v", s)
	}

	// Holder release: the token's own holder, without admin.
	wantError(t, e.call("POST", "/v1/holders/a-w1/release", "", bearer(writeToken)...), 403, wire.CodePermissionDenied, "")
	wantError(t, e.call("POST", "/v1/holders/b-w1/release", "", A...), 403, wire.CodePermissionDenied, "")
	wantError(t, e.call("POST", "/v1/holders/a-w1/release", "", bearer(readToken)...), 403, wire.CodePermissionDenied, "")
	rec = e.call("POST", "/v1/holders/a-w1/release", `{"reason":"restarted"}`, A...)
	var hr holderReleaseAnswer
	jsonOf(t, rec, &hr)
	if rec.Code != 200 || hr.Released != 3 { // its two active leases and its session
		t.Fatalf("holder release: %d %s", rec.Code, rec.Body)
	}
	for _, l := range e.list("prefix=a/&state=active", bearer(adminToken)...) {
		t.Errorf("still active after holder release: %+v", l)
	}
	if l := e.lease(200, "GET", "/v1/leases/"+e.bLease.LeaseID, "", bearer(adminToken)...); l.State != "active" {
		t.Errorf("B's lease after A's holder release: %s", l.State)
	}
}

// TestScopedEvents: tenant B's stream, from the start of the history and
// live, never shows an event of A's keys or holders; B's own events come
// through, and the observer sees a/ but none of A's sessions.
func TestScopedEvents(t *testing.T) {
	e := newScopedEnv(t)
	type stream struct {
		name string
		br   *bufio.Reader
	}
	var streams []stream
	for _, tok := range []string{tenantBToken, observerToken} {
		resp, _ := openStream(t, e.srv, "/v1/events?from=start", bearer(tok)...)
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		streams = append(streams, stream{tok, bufio.NewReader(resp.Body)})
	}
	// More of A's activity, live, then B's marker.
	A := bearer(tenantAToken)
	e.session(200, "POST", "/v1/sessions/"+e.aSession.SessionID+"/heartbeat", "", append(A, "X-Session-Token", e.aSession.Token)...)
	e.lease(200, "POST", "/v1/leases/"+e.aLease.LeaseID+"/renew", "", append(A, "X-Lease-Token", e.aLease.Token)...)
	e.lease(201, "POST", "/v1/leases", `{"key":"b/marker","holder":"b-w1","ttl_ms":60000}`, bearer(tenantBToken)...)
	for _, s := range streams {
		var seen []string
		for {
			m, err := readSSE(t, s.br)
			if err != nil {
				t.Fatalf("%s: stream ended before B's marker (%v); saw %v", s.name, err, seen)
			}
			if m.comment {
				continue
			}
			var ev wire.Event
			if err := json.Unmarshal([]byte(m.data), &ev); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, ev.Type+" "+ev.Key)
			if s.name == tenantBToken {
				e.noSecrets(t, "B's stream", m.data)
			} else if ev.Session != nil || (ev.Lease != nil && !strings.HasPrefix(ev.Lease.Key, "a/") && !strings.HasPrefix(ev.Lease.Key, "b/")) {
				t.Errorf("the observer sees %s", m.data)
			}
			if ev.Key == "b/marker" {
				break
			}
		}
		wantA := s.name == observerToken
		sawA := strings.Contains(fmt.Sprint(seen), "a/job-1")
		if sawA != wantA {
			t.Errorf("%s: saw %v", s.name, seen)
		}
	}
}

// TestScopedTokenUnchangedBehaviour: an unrestricted token of a tokens file
// with scoped entries behaves as before: it sees and lists everything, and
// a write token still needs admin for a holder release.
func TestScopedTokenUnchangedBehaviour(t *testing.T) {
	e := newScopedEnv(t)
	if got := e.list("", bearer(readToken)...); len(got) != 4 {
		t.Errorf("the unrestricted reader lists %d leases, want 4", len(got))
	}
	e.session(200, "GET", "/v1/sessions/"+e.aSession.SessionID, "", bearer(readToken)...)
	rec := e.call("GET", "/v1/whoami", "", bearer(writeToken)...)
	if strings.Contains(rec.Body.String(), "restricted") || strings.Contains(rec.Body.String(), "keys") {
		t.Errorf("whoami of an unrestricted token: %s", rec.Body)
	}
	wantError(t, e.call("POST", "/v1/holders/a-w1/release", "", bearer(writeToken)...), 403, wire.CodePermissionDenied, "")
}

// TestScopedTokensThroughFollower: on a three-server cluster, a scoped
// token's requests to a follower (forwarded to the leader, or served there
// stale) are scoped the same way.
func TestScopedTokensThroughFollower(t *testing.T) {
	tokens := scopedTokens(t)
	ms := testcluster.Start(t, func(n *node.Node) http.Handler { return New(FromNode(n), Options{Tokens: tokens}) })
	var leader, follower *clusterMember
	pollUntil(t, 30*time.Second, "a leader", func() bool { leader = leaderOf(ms); return leader != nil })
	for _, m := range ms {
		if m != leader {
			follower = m
			break
		}
	}
	once := func(method, path, body, token string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, follower.Addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		return resp.StatusCode, sb.String()
	}
	// call sends the request again while the cluster has no leader (a
	// loaded machine holds elections of its own: the request was not
	// carried out, and the test is about scopes, not elections).
	call := func(method, path, body, token string, hdr ...string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, b := once(method, path, body, token, hdr...)
			if code != http.StatusServiceUnavailable || !strings.Contains(b, string(wire.CodeNoLeader)) || time.Now().After(deadline) {
				return code, b
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	code, body := call("POST", "/v1/leases", `{"key":"a/f","holder":"a-1","ttl_ms":60000}`, tenantAToken)
	if code != 201 {
		t.Fatalf("acquire through the follower: %d %s", code, body)
	}
	var l wire.Lease
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatal(err)
	}
	mid := missingLike(l.LeaseID)
	for _, path := range []string{"/v1/leases/%s", "/v1/leases/%s?stale=true"} {
		var got, want string
		pollUntil(t, 10*time.Second, "the follower to apply the lease", func() bool {
			c, _ := call("GET", fmt.Sprintf(path, l.LeaseID), "", tenantAToken)
			return c == 200
		})
		c1, got := call("GET", fmt.Sprintf(path, l.LeaseID), "", tenantBToken)
		c2, want := call("GET", fmt.Sprintf(path, mid), "", tenantBToken)
		if c1 != 404 || c1 != c2 || strings.ReplaceAll(got, l.LeaseID, mid) != want {
			t.Errorf("%s through the follower: %d %s / %d %s", path, c1, got, c2, want)
		}
	}
	c1, got := call("POST", "/v1/leases/"+l.LeaseID+"/renew", "", tenantBToken, "X-Lease-Token", l.Token)
	c2, want := call("POST", "/v1/leases/"+mid+"/renew", "", tenantBToken, "X-Lease-Token", l.Token)
	if c1 != 404 || c1 != c2 || strings.ReplaceAll(got, l.LeaseID, mid) != want {
		t.Errorf("renew through the follower: %d %s / %d %s", c1, got, c2, want)
	}
	if c, body := call("GET", "/v1/leases", "", tenantBToken); c != 200 || strings.Contains(body, "a/f") {
		t.Errorf("B's listing through the follower: %d %s", c, body)
	}
	if c, body := call("POST", "/v1/leases/"+l.LeaseID+"/renew", "", tenantAToken, "X-Lease-Token", l.Token); c != 200 {
		t.Errorf("A's renewal through the follower: %d %s", c, body)
	}
}
