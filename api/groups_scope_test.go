package api

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestScopedTokensGroups: the lease group routes honour scoped tokens as
// the lease routes do. Another tenant's token gets, for tenant A's group,
// exactly the answer for a missing group (read, renew, release) and
// changes nothing; an acquire with one key or the holder outside its scope
// is 403 before any state is read; a token that reads a group's keys but
// may not write them gets 403 on a write; tenant A does all it needs.
func TestScopedTokensGroups(t *testing.T) {
	e := newScopedEnv(t)
	A, B := bearer(tenantAToken), bearer(tenantBToken)
	rec := e.call("POST", "/v1/groups", `{"keys":[{"key":"a/dedup"},{"key":"a/tuners","limit":2}],"holder":"a-w1","ttl_ms":60000}`, A...)
	if rec.Code != 201 {
		t.Fatalf("tenant A's group: %d %s", rec.Code, rec.Body)
	}
	var g wire.LeaseGroup
	jsonOf(t, rec, &g)
	secrets := append(e.aSecrets(), g.GroupID, g.Leases[0].LeaseID, g.Leases[1].LeaseID, "a/dedup", "a/tuners")

	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
	}{
		{"get", "GET", "/v1/groups/{id}", "", nil},
		{"get stale", "GET", "/v1/groups/{id}?stale=true", "", nil},
		{"renew with A's token", "POST", "/v1/groups/{id}/renew", "", []string{"X-Lease-Token", g.Token}},
		{"renew with a wrong token", "POST", "/v1/groups/{id}/renew", `{"ttl_ms":5000}`, []string{"X-Lease-Token", "nope"}},
		{"release with A's token", "DELETE", "/v1/groups/{id}", "", []string{"X-Lease-Token", g.Token}},
		{"release with a bad reason", "DELETE", "/v1/groups/{id}", `{"reason":"` + strings.Repeat("r", 300) + `"}`, []string{"X-Lease-Token", g.Token}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mid := missingLike(g.GroupID)
			send := func(id string) *httptest.ResponseRecorder {
				return e.call(c.method, strings.ReplaceAll(c.path, "{id}", id), c.body, append(append([]string{}, B...), c.hdr...)...)
			}
			got, want := send(g.GroupID), send(mid)
			if got.Code < 400 {
				t.Fatalf("tenant B reached A's group: %d %s", got.Code, got.Body)
			}
			sameAnswer(t, c.name, got, want, g.GroupID, mid)
			body := strings.ReplaceAll(got.Body.String(), g.GroupID, mid)
			for _, s := range secrets {
				if strings.Contains(body, s) {
					t.Errorf("answer shows %q: %s", s, body)
				}
			}
		})
	}
	for _, c := range []struct{ name, body, other string }{
		{"a key of A's", `{"keys":[{"key":"b/x"},{"key":"a/dedup"}],"holder":"b-w1","ttl_ms":5000}`,
			`{"keys":[{"key":"b/x"},{"key":"a/nothing"}],"holder":"b-w1","ttl_ms":5000}`},
		{"as A's holder", `{"keys":[{"key":"b/x"},{"key":"b/y"}],"holder":"a-w1","ttl_ms":5000}`,
			`{"keys":[{"key":"b/x"},{"key":"b/y"}],"holder":"a-nobody","ttl_ms":5000}`},
	} {
		t.Run("acquire with "+c.name, func(t *testing.T) {
			wantError(t, e.call("POST", "/v1/groups", c.body, B...), 403, wire.CodePermissionDenied, "")
			wantError(t, e.call("POST", "/v1/groups", c.other, B...), 403, wire.CodePermissionDenied, "")
		})
	}
	if ls := e.list("prefix=b/", bearer(adminToken)...); len(ls) != 1 {
		t.Fatalf("refused groups left leases: %+v", ls)
	}

	// The observer reads a/ but writes only b/: it sees A's group, may not
	// renew or release it.
	O := bearer(observerToken)
	if rec := e.call("GET", "/v1/groups/"+g.GroupID, "", O...); rec.Code != 200 {
		t.Fatalf("observer's read: %d %s", rec.Code, rec.Body)
	}
	wantError(t, e.call("POST", "/v1/groups/"+g.GroupID+"/renew", "", append(O, "X-Lease-Token", g.Token)...), 403, wire.CodePermissionDenied, "")
	wantError(t, e.call("DELETE", "/v1/groups/"+g.GroupID, "", append(O, "X-Lease-Token", g.Token)...), 403, wire.CodePermissionDenied, "")

	var got wire.LeaseGroup
	jsonOf(t, e.call("GET", "/v1/groups/"+g.GroupID, "", A...), &got)
	if got.State != "active" || got.Leases[0].RenewalCount != 0 {
		t.Fatalf("A's group after the others' requests: %+v", got)
	}
	if rec := e.call("POST", "/v1/groups/"+g.GroupID+"/renew", "", append(A, "X-Lease-Token", g.Token)...); rec.Code != 200 {
		t.Fatalf("A's renewal: %d %s", rec.Code, rec.Body)
	}
	if rec := e.call("DELETE", "/v1/groups/"+g.GroupID, "", append(A, "X-Lease-Token", g.Token)...); rec.Code != 200 {
		t.Fatalf("A's release: %d %s", rec.Code, rec.Body)
	}
}
