package api

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

const (
	readToken  = "read-secret-0123456789"
	writeToken = "write-secret-0123456789"
	adminToken = "admin-secret-0123456789"
)

func testTokens(t *testing.T) *Tokens {
	t.Helper()
	data := fmt.Sprintf(`{"tokens":[
		{"name":"reader","sha256":%q,"scopes":["read"]},
		{"name":"worker","sha256":%q,"scopes":["read","write"]},
		{"name":"ops","sha256":%q,"scopes":["admin"]}]}`,
		HashToken(readToken), HashToken(writeToken), HashToken(adminToken))
	tk, err := ParseTokens([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestParseTokensErrors(t *testing.T) {
	h := HashToken("x")
	tests := []struct {
		name, data, want string
	}{
		{"not json", `tokens`, "invalid JSON"},
		{"unknown field", `{"tokens":[],"extra":1}`, "invalid JSON"},
		{"unknown token field", `{"tokens":[{"name":"a","sha256":"` + h + `","scopes":["read"],"token":"plain"}]}`, "invalid JSON"},
		{"trailing", `{"tokens":[{"name":"a","sha256":"` + h + `","scopes":["read"]}]} {}`, "data after"},
		{"empty", `{"tokens":[]}`, "at least one token"},
		{"no name", `{"tokens":[{"sha256":"` + h + `","scopes":["read"]}]}`, "token 1: name is required"},
		{"duplicate name", `{"tokens":[{"name":"a","sha256":"` + h + `","scopes":["read"]},{"name":"a","sha256":"` + HashToken("y") + `","scopes":["read"]}]}`, `"a": name used twice`},
		{"plain token", `{"tokens":[{"name":"a","sha256":"my-secret","scopes":["read"]}]}`, "64 hex digits"},
		{"short hash", `{"tokens":[{"name":"a","sha256":"abcd","scopes":["read"]}]}`, "64 hex digits"},
		{"duplicate hash", `{"tokens":[{"name":"a","sha256":"` + h + `","scopes":["read"]},{"name":"b","sha256":"` + strings.ToUpper(h) + `","scopes":["read"]}]}`, `same sha256 as token "a"`},
		{"no scopes", `{"tokens":[{"name":"a","sha256":"` + h + `"}]}`, "scopes must list"},
		{"unknown scope", `{"tokens":[{"name":"a","sha256":"` + h + `","scopes":["root"]}]}`, `unknown scope "root"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTokens([]byte(tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadTokens(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: err = %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"tokens":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: err = %v, want it to name the file", err)
	}
	good := filepath.Join(dir, "tokens.json")
	data := `{"tokens":[{"name":"ops","sha256":"` + HashToken("s3cret") + `","scopes":["write","admin"]}]}`
	if err := os.WriteFile(good, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokens(good)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := tk.lookup("s3cret"); !ok || e.name != "ops" || e.scope != ScopeAdmin {
		t.Errorf("lookup = %+v, %v", e, ok)
	}
	if _, ok := tk.lookup(HashToken("s3cret")); ok {
		t.Error("the stored hash itself must not authenticate")
	}
}

// TestAuthScopes checks every route against each kind of credential, and
// that a rejected request never reaches the node.
func TestAuthScopes(t *testing.T) {
	type rt struct {
		method, path, body string
		hdr                []string
		need               Scope
	}
	routes := []rt{
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":1000}`, nil, ScopeWrite},
		{"GET", "/v1/leases", "", nil, ScopeRead},
		{"GET", "/v1/leases/ls_1", "", nil, ScopeRead},
		{"POST", "/v1/leases/ls_1/renew", "", []string{"X-Lease-Token", "t"}, ScopeWrite},
		{"DELETE", "/v1/leases/ls_1", "", []string{"X-Lease-Token", "t"}, ScopeWrite},
		{"POST", "/v1/leases/ls_1/revoke", `{"reason":"r"}`, nil, ScopeAdmin},
		{"POST", "/v1/heartbeat", `{"leases":[]}`, nil, ScopeWrite},
		{"POST", "/v1/sessions", `{"holder":"h","ttl_ms":1000}`, nil, ScopeWrite},
		{"GET", "/v1/sessions", "", nil, ScopeRead},
		{"GET", "/v1/sessions/ss_1", "", nil, ScopeRead},
		{"POST", "/v1/sessions/ss_1/heartbeat", "", []string{"X-Session-Token", "t"}, ScopeWrite},
		{"DELETE", "/v1/sessions/ss_1", "", []string{"X-Session-Token", "t"}, ScopeWrite},
		{"DELETE", "/v1/sessions/ss_1", "", nil, ScopeAdmin},
		{"POST", "/v1/holders/h/release", "", nil, ScopeAdmin},
		{"POST", "/v1/validate", `{"key":"k","fencing_token":1}`, nil, ScopeRead},
		{"GET", "/v1/cluster", "", nil, ScopeRead},
		{"DELETE", "/v1/cluster/members/n2", "", nil, ScopeAdmin},
		{"POST", "/v1/cluster/transfer-leadership", "", nil, ScopeAdmin},
		{"GET", "/v1/cluster/local", "", nil, ScopeAdmin},
		{"GET", "/healthz", "", nil, ScopeNone},
		{"GET", "/readyz", "", nil, ScopeNone},
		{"GET", "/metrics", "", nil, ScopeNone},
	}
	creds := []struct {
		name   string
		header string // Authorization
		scope  Scope  // ScopeNone: unauthenticated
	}{
		{"no token", "", ScopeNone},
		{"unknown token", "Bearer nope", ScopeNone},
		{"basic auth", "Basic " + readToken, ScopeNone},
		{"hash as token", "Bearer " + HashToken(adminToken), ScopeNone},
		{"read", "Bearer " + readToken, ScopeRead},
		{"write", "Bearer " + writeToken, ScopeWrite},
		{"admin", "bearer " + adminToken, ScopeAdmin},
	}
	tokens := testTokens(t)
	for _, r := range routes {
		for _, c := range creds {
			name := fmt.Sprintf("%s %s %v/%s", r.method, r.path, r.hdr, c.name)
			t.Run(name, func(t *testing.T) {
				f := newFake()
				hdr := append([]string{}, r.hdr...)
				if c.header != "" {
					hdr = append(hdr, "Authorization", c.header)
				}
				rec := do(t, New(f, Options{Tokens: tokens}), r.method, r.path, r.body, hdr...)
				switch {
				case r.need == ScopeNone:
					if rec.Code != 200 {
						t.Fatalf("open route: status %d %s", rec.Code, rec.Body)
					}
					return
				case c.scope == ScopeNone:
					wantError(t, rec, 401, wire.CodeUnauthenticated, "")
					if !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
						t.Errorf("WWW-Authenticate = %q", rec.Header().Get("WWW-Authenticate"))
					}
				case c.scope < r.need:
					e := wantError(t, rec, 403, wire.CodePermissionDenied, "")
					if !strings.Contains(e.Message, r.need.String()) {
						t.Errorf("message %q does not name the scope needed", e.Message)
					}
				default:
					if rec.Code >= 300 {
						t.Fatalf("status %d %s", rec.Code, rec.Body)
					}
					if len(f.called()) != 1 {
						t.Fatalf("calls = %v", f.called())
					}
					return
				}
				if cs := f.called(); len(cs) != 0 {
					t.Errorf("a rejected request reached the node: %v", cs)
				}
				if rec.Header().Get(headerIndex) == "" {
					t.Errorf("rejection without %s", headerIndex)
				}
				for _, secret := range []string{readToken, writeToken, adminToken} {
					if strings.Contains(rec.Body.String(), secret) {
						t.Errorf("answer echoes a token: %s", rec.Body)
					}
				}
			})
		}
	}
}

// TestAuthBeforeBody: an unauthenticated request is rejected before its body
// is looked at, so even an oversize or malformed body gets 401.
func TestAuthBeforeBody(t *testing.T) {
	f := newFake()
	h := New(f, Options{Tokens: testTokens(t)})
	wantError(t, do(t, h, "POST", "/v1/leases", strings.Repeat("x", 2*DefaultMaxBodyBytes)), 401, wire.CodeUnauthenticated, "")
	wantError(t, do(t, h, "POST", "/v1/leases", "{", "Authorization", "Bearer "+readToken), 403, wire.CodePermissionDenied, "")
	if cs := f.called(); len(cs) != 0 {
		t.Errorf("calls = %v", cs)
	}
}

// TestSecretsNotLogged drives requests full of secrets through a handler
// logging at debug level and checks that none of them reaches the log.
func TestSecretsNotLogged(t *testing.T) {
	var logs bytes.Buffer
	f := newFake()
	h := New(f, Options{Tokens: testTokens(t), Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	auth := []string{"Authorization", "Bearer " + adminToken}
	do(t, h, "POST", "/v1/leases/ls_1/revoke", `{"reason":"r"}`, auth...)
	do(t, h, "DELETE", "/v1/leases/ls_1", "", append(auth, "X-Lease-Token", "lease-tok-SECRET")...)
	do(t, h, "POST", "/v1/validate", `{"lease_id":"ls_1","token":"validate-tok-SECRET"}`, auth...)
	do(t, h, "GET", "/v1/leases", "", "Authorization", "Bearer wrong-tok-SECRET")
	f.err = fmt.Errorf("disk trouble")
	uncheckedExchanges(t) // an INTERNAL answer, on purpose
	do(t, h, "POST", "/v1/sessions/ss_1/heartbeat", "", append(auth, "X-Session-Token", "session-tok-SECRET")...)
	out := logs.String()
	if !strings.Contains(out, "admin request") || !strings.Contains(out, "token_name=ops") {
		t.Errorf("admin actions are not audited: %q", out)
	}
	if !strings.Contains(out, "request failed") {
		t.Errorf("the failure was not logged: %q", out)
	}
	for _, secret := range []string{adminToken, "SECRET", "lease-secret"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
}

func TestScopeNames(t *testing.T) {
	for _, s := range []Scope{ScopeRead, ScopeWrite, ScopeAdmin} {
		got, err := ParseScope(s.String())
		if err != nil || got != s {
			t.Errorf("ParseScope(%q) = %v, %v", s, got, err)
		}
	}
	if !(ScopeNone < ScopeRead && ScopeRead < ScopeWrite && ScopeWrite < ScopeAdmin) {
		t.Error("scopes are not ordered")
	}
}

// TestTokensReplace: a replaced set answers with the new tokens only, and
// a Tokens shared with a server sees the replacement at once.
func TestTokensReplace(t *testing.T) {
	file := func(names ...string) []byte {
		var parts []string
		for _, n := range names {
			parts = append(parts, `{"name":"`+n+`","sha256":"`+HashToken("secret-"+n)+`","scopes":["read"]}`)
		}
		return []byte(`{"tokens":[` + strings.Join(parts, ",") + `]}`)
	}
	toks, err := ParseTokens(file("a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	next, err := ParseTokens(file("b", "c"))
	if err != nil {
		t.Fatal(err)
	}
	toks.Replace(next)
	if toks.Len() != 2 {
		t.Fatalf("Len %d after Replace, want 2", toks.Len())
	}
	for name, want := range map[string]bool{"a": false, "b": true, "c": true} {
		e, ok := toks.lookup("secret-" + name)
		if ok != want || (ok && e.name != name) {
			t.Errorf("lookup of %s's token: %+v %v, want found=%v", name, e, ok, want)
		}
	}
}
