package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestGrantRoutes: the grant field of an acquire and a renewal reaches the
// node; a GET with a lease or session token is the holder's read with a
// grant; GET /v1/keys needs no token even with auth on; a grant field
// that is not a boolean is refused.
func TestGrantRoutes(t *testing.T) {
	f := newFake()
	h := New(f, Options{Tokens: testTokens(t)})
	write := []string{"Authorization", "Bearer " + writeToken}
	read := []string{"Authorization", "Bearer " + readToken}

	rec := do(t, h, "POST", "/v1/leases", `{"key":"k","holder":"w1","ttl_ms":5000,"grant":true}`, write...)
	if rec.Code != 201 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	if c := f.only(t, "Acquire"); !c.args[0].(wire.AcquireRequest).Grant {
		t.Fatalf("acquire args %+v", c.args)
	}
	f.calls = nil
	rec = do(t, h, "POST", "/v1/leases/ls_1/renew", `{"grant":true}`, append(write, "X-Lease-Token", "lt")...)
	if rec.Code != 200 {
		t.Fatalf("renew: %d %s", rec.Code, rec.Body)
	}
	if c := f.only(t, "Renew"); !reflect.DeepEqual(c.args[0], wire.RenewRequest{LeaseID: "ls_1", Token: "lt", Grant: true}) {
		t.Fatalf("renew args %+v", c.args)
	}
	for _, c := range []struct {
		target string
		hdr    []string
		want   []any
	}{
		{"/v1/leases/ls_7", []string{"X-Lease-Token", "lt"}, []any{wire.GrantRequest{LeaseID: "ls_7", Token: "lt"}, false}},
		{"/v1/leases/ls_7?stale=true", []string{"X-Session-Token", "st"}, []any{wire.GrantRequest{LeaseID: "ls_7", SessionToken: "st"}, true}},
	} {
		f.calls = nil
		rec := do(t, h, "GET", c.target, "", append(read, c.hdr...)...)
		var l wire.Lease
		jsonOf(t, rec, &l)
		if rec.Code != 200 || l.Grant != "h.p.s" {
			t.Fatalf("GET %s: %d %s", c.target, rec.Code, rec.Body)
		}
		if got := f.only(t, "LeaseGrant"); !reflect.DeepEqual(got.args, c.want) {
			t.Fatalf("GET %s: args %+v, want %+v", c.target, got.args, c.want)
		}
	}
	f.calls = nil
	rec = do(t, h, "GET", "/v1/keys", "")
	if rec.Code != 200 {
		t.Fatalf("keys without a token: %d %s", rec.Code, rec.Body)
	}
	ks, err := grant.ParseKeySet(rec.Body.Bytes())
	if err != nil || ks.ClusterID != "c-1" || len(ks.Keys) != 1 {
		t.Fatalf("keys: %+v %v", ks, err)
	}
	if got := f.only(t, "GrantKeys"); !reflect.DeepEqual(got.args, []any{false}) {
		t.Fatalf("keys args %+v", got.args)
	}
	f.calls = nil
	wantError(t, do(t, h, "POST", "/v1/leases", `{"key":"k","holder":"w1","ttl_ms":5000,"grant":"yes"}`, write...), 400, wire.CodeInvalidArgument, "grant")
	wantError(t, do(t, h, "POST", "/v1/leases/ls_1/renew", `{"grant":1}`, append(write, "X-Lease-Token", "lt")...), 400, wire.CodeInvalidArgument, "grant")
	wantError(t, do(t, h, "GET", "/v1/keys?stale=maybe", ""), 400, wire.CodeInvalidArgument, "stale")
	if cs := f.called(); len(cs) != 0 {
		t.Fatalf("refused requests reached the node: %v", cs)
	}
}

// grantEnv is a real node behind the API with auth on, once its grant key
// is recorded.
func grantEnv(t *testing.T) *useCaseEnv {
	e := newUseCaseEnv(t, Options{Tokens: testTokens(t)})
	pollUntil(t, 10*time.Second, "the node's grant key to be recorded", func() bool {
		var ks grant.KeySet
		rec := e.call("GET", "/v1/keys", "")
		return rec.Code == 200 && json.Unmarshal(rec.Body.Bytes(), &ks) == nil && len(ks.Keys) == 1
	})
	return e
}

func (e *useCaseEnv) keySet() *grant.KeySet {
	e.t.Helper()
	rec := e.call("GET", "/v1/keys", "")
	ks, err := grant.ParseKeySet(rec.Body.Bytes())
	if rec.Code != 200 || err != nil {
		e.t.Fatalf("GET /v1/keys: %d %s %v", rec.Code, rec.Body, err)
	}
	return ks
}

// TestGrantsHTTP: over the HTTP API of a real node, an acquire and a
// renewal with "grant": true, and the holder's GET, answer grants that
// verify against GET /v1/keys and state the lease; a GET without a token
// has none; a wrong token is refused and shows no grant.
func TestGrantsHTTP(t *testing.T) {
	e := grantEnv(t)
	write := []string{"Authorization", "Bearer " + writeToken}
	read := []string{"Authorization", "Bearer " + readToken}
	ks := e.keySet()
	if ks.ClusterID == "" || ks.Keys[0].Kid != e.n.GrantKeyID() {
		t.Fatalf("key set %+v", ks)
	}
	l := e.lease(201, "POST", "/v1/leases", `{"key":"job/1","holder":"agent-1","ttl_ms":30000,"grant":true}`, write...)
	c, err := ks.Verify(l.Grant, grant.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Key != "job/1" || c.Holder != "agent-1" || c.LeaseID != l.LeaseID || c.FencingToken != l.FencingToken || c.TTLMS != 30000 || c.ClusterID != ks.ClusterID {
		t.Fatalf("claims %+v of lease %+v", c, l)
	}
	r := e.lease(200, "POST", "/v1/leases/"+l.LeaseID+"/renew", `{"grant":true}`, append(write, "X-Lease-Token", l.Token)...)
	if _, err := ks.Verify(r.Grant, grant.VerifyOptions{}); err != nil || r.RenewalCount != 1 {
		t.Fatalf("renewal's grant: %v (%+v)", err, r)
	}
	if g := e.lease(200, "GET", "/v1/leases/"+l.LeaseID, "", read...); g.Grant != "" {
		t.Fatalf("a GET without the lease token has a grant")
	}
	g := e.lease(200, "GET", "/v1/leases/"+l.LeaseID, "", append(read, "X-Lease-Token", l.Token)...)
	if _, err := ks.Verify(g.Grant, grant.VerifyOptions{}); err != nil || g.Token != "" {
		t.Fatalf("holder's GET: %v (%+v)", err, g)
	}
	rec := e.call("GET", "/v1/leases/"+l.LeaseID, "", append(read, "X-Lease-Token", "wrong")...)
	wantError(t, rec, 403, wire.CodeLeaseTokenInvalid, "")
	if strings.Contains(rec.Body.String(), "grant") {
		t.Fatalf("a refusal shows a grant: %s", rec.Body)
	}
	// Altered in transit: the resource refuses it.
	parts := strings.Split(g.Grant, ".")
	claims, _ := json.Marshal(map[string]any{"iss": ks.ClusterID, "iat": 1, "exp": 1 << 40, "key": "job/1", "lease_id": l.LeaseID,
		"holder": "agent-1", "fencing_token": l.FencingToken + 1000, "limit": 1})
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString(claims) + "." + parts[2]
	if _, err := ks.Verify(forged, grant.VerifyOptions{}); !errors.Is(err, grant.ErrBadSignature) {
		t.Fatalf("an altered grant: %v", err)
	}
}

// TestGrantVerifiedByPyJWT: a grant verifies with a verifier not written
// here, Debian's python3-jwt (PyJWT) with python3-cryptography, fetching
// the key set over HTTP with its own JWKS client; an altered grant and a
// grant checked against another cluster id are refused by it.
func TestGrantVerifiedByPyJWT(t *testing.T) {
	const python = "/usr/bin/python3" // Debian's, where python3-jwt installs
	if out, err := exec.Command(python, "-c", "import jwt, cryptography").CombinedOutput(); err != nil {
		t.Skipf("%s lacks the jwt or cryptography module (apt-get install python3-jwt python3-cryptography): %v %s", python, err, out)
	}
	e := grantEnv(t)
	ks := e.keySet()
	l := e.lease(201, "POST", "/v1/leases", `{"key":"tuners","holder":"w-9","ttl_ms":60000,"limit":2,"grant":true}`,
		"Authorization", "Bearer "+writeToken)
	script := filepath.Join(t.TempDir(), "verify.py")
	if err := os.WriteFile(script, []byte(pyVerify), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(grantStr, cluster string) (string, error) {
		cmd := exec.Command(python, script, e.srv.URL+"/v1/keys", cluster)
		cmd.Stdin = strings.NewReader(grantStr)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(l.Grant, ks.ClusterID)
	if err != nil {
		t.Fatalf("PyJWT refused the grant: %v\n%s", err, out)
	}
	var claims map[string]any
	if err := json.Unmarshal([]byte(out), &claims); err != nil {
		t.Fatalf("PyJWT's output %q: %v", out, err)
	}
	want := map[string]any{"iss": ks.ClusterID, "key": "tuners", "holder": "w-9", "lease_id": l.LeaseID,
		"fencing_token": float64(l.FencingToken), "limit": 2.0, "ttl_ms": 60000.0, "server_id": e.n.NodeID()}
	for k, v := range want {
		if claims[k] != v {
			t.Fatalf("PyJWT read %s = %v, want %v (%v)", k, claims[k], v, claims)
		}
	}
	p := strings.Split(l.Grant, ".")
	sig := []byte(p[2])
	sig[10] = 'A'
	if p[2][10] == 'A' {
		sig[10] = 'B'
	}
	for name, c := range map[string][3]string{
		"altered signature": {p[0] + "." + p[1] + "." + string(sig), ks.ClusterID, "InvalidSignatureError"},
		"another cluster":   {l.Grant, "some-other-cluster", "InvalidIssuerError"},
	} {
		if out, err := run(c[0], c[1]); err == nil || !strings.Contains(out, c[2]) {
			t.Errorf("%s: PyJWT answered %v, want %s:\n%s", name, err, c[2], out)
		}
	}
}

// pyVerify is what a Python resource runs (docs/security.md shows the
// same): the key set through PyJWT's JWKS client (cached), the grant on
// stdin, the cluster id as the expected issuer.
const pyVerify = `import json, sys, jwt
keys_url, cluster_id = sys.argv[1], sys.argv[2]
grant = sys.stdin.read().strip()
jwks = jwt.PyJWKClient(keys_url)
key = jwks.get_signing_key_from_jwt(grant)
claims = jwt.decode(grant, key.key, algorithms=["EdDSA"], issuer=cluster_id,
                    options={"require": ["iss", "iat", "exp"]})
print(json.dumps(claims))
`
