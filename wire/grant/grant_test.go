package grant

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The example key of RFC 8037, appendix A.1.
const (
	rfcD   = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"
	rfcX   = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
	rfcKid = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
	// A.4: {"alg":"EdDSA"} over "Example of Ed25519 signing".
	rfcJWS = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc.hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"
)

func rfcKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	d, err := base64.RawURLEncoding.DecodeString(rfcD)
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(d)
}

// TestRFC8037Vectors: the thumbprint (kid) and the EdDSA signature of RFC
// 8037's examples, so that the encoding is the standard one.
func TestRFC8037Vectors(t *testing.T) {
	priv := rfcKey(t)
	pub := priv.Public().(ed25519.PublicKey)
	if x := base64.RawURLEncoding.EncodeToString(pub); x != rfcX {
		t.Fatalf("x %s, want %s", x, rfcX)
	}
	if kid := Thumbprint(pub); kid != rfcKid {
		t.Fatalf("thumbprint %s, want %s", kid, rfcKid)
	}
	if jwk := PublicJWK(pub); jwk.Kid != rfcKid || jwk.X != rfcX || jwk.Kty != "OKP" || jwk.Crv != "Ed25519" || jwk.Alg != "EdDSA" || jwk.Use != "sig" {
		t.Fatalf("jwk %+v", jwk)
	}
	i := strings.LastIndexByte(rfcJWS, '.')
	sig := ed25519.Sign(priv, []byte(rfcJWS[:i]))
	if got := base64.RawURLEncoding.EncodeToString(sig); got != rfcJWS[i+1:] {
		t.Fatalf("signature %s, want %s", got, rfcJWS[i+1:])
	}
}

var testClaims = Claims{ClusterID: "c-1", IssuedAt: 1_700_000_000, Expiry: 1_700_000_030, ServerID: "n1",
	Key: "camera/7", LeaseID: "ls_01", Holder: "runner-a", FencingToken: 42, Limit: 1, TTLMS: 30_000}

// at is a clock inside the test claims' validity.
func at() time.Time { return time.Unix(1_700_000_010, 0) }

func testSet(keys ...ed25519.PrivateKey) *KeySet {
	ks := &KeySet{ClusterID: "c-1", Keys: []JWK{}}
	for _, k := range keys {
		ks.Keys = append(ks.Keys, PublicJWK(k.Public().(ed25519.PublicKey)))
	}
	return ks
}

func sign(t *testing.T, priv ed25519.PrivateKey, c Claims) string {
	t.Helper()
	g, err := NewSigner(priv).Sign(&c)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// parts splits a compact JWS and decodes its three parts.
func parts(t *testing.T, g string) (hdr, payload map[string]any, sig []byte) {
	t.Helper()
	p := strings.Split(g, ".")
	if len(p) != 3 {
		t.Fatalf("%d parts", len(p))
	}
	dec := func(s string, v any) {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		if v == nil {
			sig = b
			return
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	dec(p[0], &hdr)
	dec(p[1], &payload)
	dec(p[2], nil)
	return
}

func enc(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestSignVerify: a grant's header, claims and signature are what the
// package documents, and it verifies against a set that has its key (with
// other keys beside it), returning the claims.
func TestSignVerify(t *testing.T) {
	priv := rfcKey(t)
	other := GenerateKey()
	g := sign(t, priv, testClaims)
	hdr, payload, sig := parts(t, g)
	if len(hdr) != 3 || hdr["alg"] != "EdDSA" || hdr["kid"] != rfcKid || hdr["typ"] != Type {
		t.Fatalf("header %v", hdr)
	}
	want := map[string]any{"iss": "c-1", "iat": 1.7e9, "exp": 1.70000003e9, "server_id": "n1", "key": "camera/7",
		"lease_id": "ls_01", "holder": "runner-a", "fencing_token": 42.0, "limit": 1.0, "ttl_ms": 30000.0}
	if len(payload) != len(want) {
		t.Fatalf("claims %v, want %v", payload, want)
	}
	for k, v := range want {
		if payload[k] != v {
			t.Fatalf("claim %s = %v, want %v", k, payload[k], v)
		}
	}
	if len(sig) != ed25519.SignatureSize {
		t.Fatalf("signature of %d bytes", len(sig))
	}
	for _, ks := range []*KeySet{testSet(priv), testSet(other, priv)} {
		c, err := ks.Verify(g, VerifyOptions{Now: at})
		if err != nil {
			t.Fatal(err)
		}
		if *c != testClaims {
			t.Fatalf("claims %+v, want %+v", c, testClaims)
		}
	}
	// A bound lease names its session.
	bound := testClaims
	bound.SessionID = "ss_9"
	if c, err := testSet(priv).Verify(sign(t, priv, bound), VerifyOptions{Now: at}); err != nil || c.SessionID != "ss_9" {
		t.Fatalf("bound: %+v %v", c, err)
	}
	// Ed25519 is deterministic: the same claims, the same grant.
	if again := sign(t, priv, testClaims); again != g {
		t.Fatal("signing twice gave two grants")
	}
}

// TestVerifyRefuses: forged, altered, unknown-key, other-cluster, expired
// and malformed grants fail, each with its error.
func TestVerifyRefuses(t *testing.T) {
	priv, other := rfcKey(t), GenerateKey()
	ks := testSet(priv)
	g := sign(t, priv, testClaims)
	p := strings.Split(g, ".")
	hdr, payload, _ := parts(t, g)

	bigger := map[string]any{}
	for k, v := range payload {
		bigger[k] = v
	}
	bigger["fencing_token"] = uint64(1) << 60
	otherCluster := testClaims
	otherCluster.ClusterID = "c-2"
	forgedHdr := map[string]any{"alg": "EdDSA", "kid": rfcKid, "typ": Type}
	forgedBody := enc(bigger)
	forgedSig := base64.RawURLEncoding.EncodeToString(ed25519.Sign(other, []byte(enc(forgedHdr)+"."+forgedBody)))
	flipped := []byte(p[2])
	flipped[3] ^= 1
	if flipped[3] == p[2][3] {
		t.Fatal("flip did nothing")
	}
	none := map[string]any{"alg": "none", "kid": rfcKid, "typ": Type}
	crit := map[string]any{"alg": "EdDSA", "kid": rfcKid, "typ": Type, "crit": []string{"exp"}}
	noTyp := map[string]any{"alg": "EdDSA", "kid": rfcKid}
	missing := map[string]any{}
	for k, v := range payload {
		if k != "fencing_token" {
			missing[k] = v
		}
	}

	cases := []struct {
		name  string
		grant string
		opts  VerifyOptions
		want  error
	}{
		{"forged: signed by another key under the cluster's kid", enc(forgedHdr) + "." + forgedBody + "." + forgedSig, VerifyOptions{Now: at}, ErrBadSignature},
		{"altered claims", p[0] + "." + enc(bigger) + "." + p[2], VerifyOptions{Now: at}, ErrBadSignature},
		{"altered signature", p[0] + "." + p[1] + "." + string(flipped), VerifyOptions{Now: at}, ErrBadSignature},
		{"signature of another grant", p[0] + "." + p[1] + "." + strings.Split(sign(t, priv, otherCluster), ".")[2], VerifyOptions{Now: at}, ErrBadSignature},
		{"a key not in the set", sign(t, other, testClaims), VerifyOptions{Now: at}, ErrUnknownKey},
		{"another cluster's grant", sign(t, priv, otherCluster), VerifyOptions{Now: at}, ErrOtherCluster},
		{"another cluster expected", g, VerifyOptions{Now: at, ClusterID: "c-3"}, ErrOtherCluster},
		{"past exp", g, VerifyOptions{Now: func() time.Time { return time.Unix(testClaims.Expiry+1, 0) }}, ErrExpired},
		{"past exp and leeway", g, VerifyOptions{Now: func() time.Time { return time.Unix(testClaims.Expiry+11, 0) }, Leeway: 10 * time.Second}, ErrExpired},
		{"alg none", enc(none) + "." + p[1] + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"alg none, no signature", enc(none) + "." + p[1] + ".", VerifyOptions{Now: at}, ErrMalformed},
		{"a crit header", enc(crit) + "." + p[1] + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"no typ", enc(noTyp) + "." + p[1] + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"no fencing token", p[0] + "." + enc(missing) + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"two parts", p[0] + "." + p[1], VerifyOptions{Now: at}, ErrMalformed},
		{"four parts", g + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"padding", p[0] + "=." + p[1] + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"standard base64", strings.ReplaceAll(strings.ReplaceAll(g, "-", "+"), "_", "/"), VerifyOptions{Now: at}, ErrMalformed},
		{"empty", "", VerifyOptions{Now: at}, ErrMalformed},
		{"huge", strings.Repeat("a", MaxTokenBytes+1), VerifyOptions{Now: at}, ErrMalformed},
		{"payload not JSON", p[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("not json")) + "." + p[2], VerifyOptions{Now: at}, ErrMalformed},
		{"short signature", p[0] + "." + p[1] + "." + p[2][:40], VerifyOptions{Now: at}, ErrMalformed},
	}
	if hdr["kid"] != rfcKid {
		t.Fatal("unexpected kid")
	}
	for _, c := range cases {
		cl, err := ks.Verify(c.grant, c.opts)
		if !errors.Is(err, c.want) || cl != nil {
			t.Errorf("%s: %v (claims %+v), want %v", c.name, err, cl, c.want)
		}
	}
	// The other errors are not matched by mistake.
	if _, err := ks.Verify(sign(t, other, testClaims), VerifyOptions{Now: at}); errors.Is(err, ErrBadSignature) || errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown key also matches another error: %v", err)
	}
	// Within the leeway, or with expiry ignored, a late grant passes.
	late := func() time.Time { return time.Unix(testClaims.Expiry+5, 0) }
	if _, err := ks.Verify(g, VerifyOptions{Now: late, Leeway: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Verify(g, VerifyOptions{Now: func() time.Time { return time.Unix(1<<40, 0) }, IgnoreExpiry: true}); err != nil {
		t.Fatal(err)
	}
	// A set that names no cluster, without a cluster to expect: refused.
	anon := testSet(priv)
	anon.ClusterID = ""
	if _, err := anon.Verify(g, VerifyOptions{Now: at}); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("no cluster id: %v", err)
	}
	if _, err := anon.Verify(g, VerifyOptions{Now: at, ClusterID: "c-1"}); err != nil {
		t.Fatal(err)
	}
}

// TestParseKeySet: a set from JSON, refusing keys that are not Ed25519
// signing keys and a document without keys.
func TestParseKeySet(t *testing.T) {
	priv := rfcKey(t)
	good, _ := json.Marshal(testSet(priv))
	ks, err := ParseKeySet(good)
	if err != nil || ks.ClusterID != "c-1" || len(ks.Keys) != 1 || ks.Keys[0].Kid != rfcKid {
		t.Fatalf("%+v %v", ks, err)
	}
	retired := time.Unix(1_700_000_000, 0).UTC()
	withRetired := testSet(priv)
	withRetired.Keys[0].ServerID, withRetired.Keys[0].RetiredAt = "n1", &retired
	b, _ := json.Marshal(withRetired)
	if ks, err := ParseKeySet(b); err != nil || !ks.Keys[0].RetiredAt.Equal(retired) || ks.Keys[0].ServerID != "n1" {
		t.Fatalf("%+v %v", ks, err)
	}
	for name, doc := range map[string]string{
		"not json":  "{",
		"no keys":   `{"cluster_id":"c"}`,
		"rsa":       `{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","kid":"r"}]}`,
		"x448":      `{"keys":[{"kty":"OKP","crv":"Ed448","x":"` + rfcX + `","kid":"k"}]}`,
		"short x":   `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA","kid":"k"}]}`,
		"other alg": `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"` + rfcX + `","kid":"k","alg":"ES256"}]}`,
		"enc key":   `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"` + rfcX + `","kid":"k","use":"enc"}]}`,
	} {
		if ks, err := ParseKeySet([]byte(doc)); err == nil {
			t.Errorf("%s: parsed %+v", name, ks)
		}
	}
}

// TestKeyFile: a key file is made once (0600, PKCS #8 PEM) and read back
// the same; bad files are refused with errors that never show the key.
func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "grant.key")
	k1, created, err := LoadOrCreateKeyFile(path)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	k2, created, err := LoadOrCreateKeyFile(path)
	if err != nil || created || !k1.Equal(k2) {
		t.Fatalf("load: created %v, err %v, same %v", created, err, k1.Equal(k2))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left %d files", len(entries))
	}
	pemBytes, _ := os.ReadFile(path)
	if !bytes.HasPrefix(pemBytes, []byte("-----BEGIN PRIVATE KEY-----\n")) {
		t.Fatalf("file starts %q", pemBytes[:20])
	}
	if k3, err := ParsePrivateKey(MarshalPrivateKey(k1)); err != nil || !k3.Equal(k1) {
		t.Fatal(err)
	}

	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER})
	body := strings.Split(string(pemBytes), "\n")[1]
	for name, content := range map[string][]byte{
		"empty":         nil,
		"text":          []byte("hello"),
		"an EC key":     ecPEM,
		"another block": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}),
		"trailing data": append(append([]byte(nil), pemBytes...), "junk"...),
		"bad DER":       pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
		"two keys":      append(append([]byte(nil), pemBytes...), pemBytes...),
	} {
		p := filepath.Join(dir, "bad")
		os.WriteFile(p, content, 0o600)
		_, _, err := LoadOrCreateKeyFile(p)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if strings.Contains(err.Error(), body[:16]) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q shows the key or does not name the file", name, err)
		}
	}
	// A directory that cannot be written: the error, no key.
	if err := os.Chmod(dir, 0o500); err == nil && os.Geteuid() != 0 {
		defer os.Chmod(dir, 0o700)
		if _, _, err := LoadOrCreateKeyFile(filepath.Join(dir, "new.key")); err == nil {
			t.Fatal("created a key in a read-only directory")
		}
	}
}

// BenchmarkSign is the cost of one grant on the answering server.
func BenchmarkSign(b *testing.B) {
	s := NewSigner(GenerateKey())
	c := testClaims
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sign(&c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify is the cost of one verification at the resource.
func BenchmarkVerify(b *testing.B) {
	k := GenerateKey()
	s := NewSigner(k)
	g, _ := s.Sign(&testClaims)
	ks := testSet(k)
	opts := VerifyOptions{IgnoreExpiry: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ks.Verify(g, opts); err != nil {
			b.Fatal(err)
		}
	}
}
