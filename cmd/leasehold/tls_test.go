package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"flag"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testpki"
)

func TestServerTLSFlagsAndEnv(t *testing.T) {
	key32 := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	a, _, _ := testApp(map[string]string{
		"LEASEHOLD_TLS_CERT": "/env/cert.pem", "LEASEHOLD_TLS_KEY": "/env/key.pem",
		"LEASEHOLD_TLS_CLIENT_CA": "/env/clients.pem", "LEASEHOLD_TLS_CLIENT_AUTH": "verify-if-given",
		"LEASEHOLD_TLS_CA": "/env/ca.pem", "LEASEHOLD_RAFT_TLS_CA": "/env/raft-ca.pem",
		"LEASEHOLD_GOSSIP_KEY": key32, "LEASEHOLD_INSECURE_PLAINTEXT": "true",
	})
	c, err := a.parseServerFlags([]string{"--raft-tls-cert", "/f/raft.pem", "--raft-tls-key", "/f/raft-key.pem", "--tls-ca", "/f/ca.pem"})
	if err != nil {
		t.Fatal(err)
	}
	f := c.tls
	if f.cert != "/env/cert.pem" || f.key != "/env/key.pem" || f.clientCA != "/env/clients.pem" || f.clientAuth != "verify-if-given" ||
		f.ca != "/f/ca.pem" || f.raftCA != "/env/raft-ca.pem" || f.raftCert != "/f/raft.pem" || f.raftKey != "/f/raft-key.pem" ||
		f.gossipKey != key32 || !f.insecure {
		t.Fatalf("flags: %+v", f)
	}
	a, _, _ = testApp(nil)
	if c, err = a.parseServerFlags(nil); err != nil || c.tls.clientAuth != "require" || c.tls.insecure || c.tls.cert != "" {
		t.Fatalf("defaults: %+v %v", c.tls, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key"},
		{[]string{"--tls-key", "k.pem"}, "--tls-cert and --tls-key"},
		{[]string{"--tls-client-ca", "ca.pem"}, "--tls-client-ca needs --tls-cert"},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "maybe"}, "--tls-client-auth"},
		{[]string{"--raft-tls-cert", "c"}, "--raft-tls-cert and --raft-tls-key"},
		{[]string{"--raft-tls-cert", "c", "--raft-tls-key", "k"}, "needs --raft-tls-ca"},
		{[]string{"--raft-tls-ca", "ca"}, "--raft-tls-ca needs a certificate"},
		{[]string{"--gossip-key", key32, "--gossip-key-file", "f"}, "not both"},
	} {
		_, err := a.parseServerFlags(tc.args)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(ue.msg, tc.want) {
			t.Errorf("%q: %v, want a usage error about %q", tc.args, err, tc.want)
		}
	}
}

// TestClientTLSEnvNames: client commands read their TLS settings from
// LEASEHOLD_CLIENT_CA, _CERT and _KEY, not from the server's
// LEASEHOLD_TLS_* (in a server's environment those name the server's own
// certificate). The old names still work, with a deprecation warning on
// stderr, but only when no new name is set, and flags win over both.
func TestClientTLSEnvNames(t *testing.T) {
	server := map[string]string{ // a server's container
		"LEASEHOLD_TLS_CA": "/srv/ca.pem", "LEASEHOLD_TLS_CERT": "/srv/server.pem", "LEASEHOLD_TLS_KEY": "/srv/server-key.pem",
	}
	with := func(extra map[string]string) map[string]string {
		env := maps.Clone(server)
		maps.Copy(env, extra)
		return env
	}
	for _, tt := range []struct {
		name          string
		env           map[string]string
		args          []string
		ca, cert, key string
		warn, notWarn []string // variables the warning names, or must not
	}{
		{
			name: "new names, in a server's environment: the server's certificate is not presented",
			env:  with(map[string]string{"LEASEHOLD_CLIENT_CA": "/c/ca.pem", "LEASEHOLD_CLIENT_CERT": "/c/me.pem", "LEASEHOLD_CLIENT_KEY": "/c/me-key.pem"}),
			ca:   "/c/ca.pem", cert: "/c/me.pem", key: "/c/me-key.pem",
			notWarn: []string{"LEASEHOLD_TLS_"},
		},
		{
			name:    "a new CA alone: the old certificate names are ignored too",
			env:     with(map[string]string{"LEASEHOLD_CLIENT_CA": "/c/ca.pem"}),
			ca:      "/c/ca.pem",
			notWarn: []string{"LEASEHOLD_TLS_"},
		},
		{
			name: "a new certificate pair alone: the old CA is ignored, no key from the server",
			env:  with(map[string]string{"LEASEHOLD_CLIENT_CERT": "/c/me.pem", "LEASEHOLD_CLIENT_KEY": "/c/me-key.pem"}),
			cert: "/c/me.pem", key: "/c/me-key.pem",
			notWarn: []string{"LEASEHOLD_TLS_"},
		},
		{
			name: "old names only: used, with a warning naming each and its replacement",
			env:  server,
			ca:   "/srv/ca.pem", cert: "/srv/server.pem", key: "/srv/server-key.pem",
			warn: []string{"LEASEHOLD_TLS_CA", "LEASEHOLD_CLIENT_CA", "LEASEHOLD_TLS_CERT", "LEASEHOLD_CLIENT_CERT", "LEASEHOLD_TLS_KEY", "LEASEHOLD_CLIENT_KEY", "deprecated"},
		},
		{
			name: "old names, flags given: flags win, no warning for what they override",
			env:  server,
			args: []string{"--tls-cert", "/f/c.pem", "--tls-key", "/f/k.pem"},
			ca:   "/srv/ca.pem", cert: "/f/c.pem", key: "/f/k.pem",
			warn:    []string{"LEASEHOLD_TLS_CA"},
			notWarn: []string{"LEASEHOLD_TLS_CERT", "LEASEHOLD_TLS_KEY"},
		},
		{
			name: "new names, flags given: flags win",
			env:  map[string]string{"LEASEHOLD_CLIENT_CA": "/c/ca.pem", "LEASEHOLD_CLIENT_CERT": "/c/me.pem", "LEASEHOLD_CLIENT_KEY": "/c/me-key.pem"},
			args: []string{"--tls-cert", "/f/c.pem"},
			ca:   "/c/ca.pem", cert: "/f/c.pem", key: "/c/me-key.pem",
			notWarn: []string{"LEASEHOLD_TLS_"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, _, stderr := testApp(tt.env)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			var cf clientFlags
			cf.register(fs)
			if _, err := a.parse(fs, tt.args, clientEnv(), 0); err != nil {
				t.Fatal(err)
			}
			if cf.tls.ca != tt.ca || cf.tls.cert != tt.cert || cf.tls.key != tt.key {
				t.Errorf("client TLS flags %+v, want ca %q cert %q key %q", cf.tls, tt.ca, tt.cert, tt.key)
			}
			for _, w := range tt.warn {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q does not mention %s", stderr.String(), w)
				}
			}
			for _, w := range tt.notWarn {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q mentions %s", stderr.String(), w)
				}
			}
		})
	}

	// The server reads the old names, without a warning, and not the
	// client's.
	a, _, stderr := testApp(with(map[string]string{"LEASEHOLD_CLIENT_CERT": "/c/me.pem", "LEASEHOLD_CLIENT_KEY": "/c/me-key.pem"}))
	c, err := a.parseServerFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.tls.cert != "/srv/server.pem" || c.tls.key != "/srv/server-key.pem" || c.tls.ca != "/srv/ca.pem" {
		t.Errorf("server TLS flags %+v", c.tls)
	}
	if stderr.Len() != 0 {
		t.Errorf("server flags: stderr %q", stderr.String())
	}
}

func TestClientTLSFlagsEnv(t *testing.T) {
	a, _, _ := testApp(map[string]string{"LEASEHOLD_CLIENT_CA": "/env/ca.pem", "LEASEHOLD_CLIENT_CERT": "/env/c.pem", "LEASEHOLD_CLIENT_KEY": "/env/k.pem"})
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	if _, err := a.parse(fs, []string{"--tls-cert", "/f/c.pem"}, clientEnv(), 0); err != nil {
		t.Fatal(err)
	}
	if cf.tls.ca != "/env/ca.pem" || cf.tls.cert != "/f/c.pem" || cf.tls.key != "/env/k.pem" {
		t.Fatalf("client TLS flags: %+v", cf.tls)
	}

	// A CA alone makes host:port addresses https.
	ca := testpki.NewCA(t, "ca")
	files := ca.WriteFiles(t.TempDir(), "c", ca.Issue("client"))
	cf = clientFlags{addr: "127.0.0.1:1,http://127.0.0.1:2", timeout: time.Second, tls: clientTLSFlags{ca: files.CA}}
	c, err := cf.client()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Addrs(); got[0] != "https://127.0.0.1:1" || got[1] != "http://127.0.0.1:2" {
		t.Fatalf("addresses %q", got)
	}
	cf.tls = clientTLSFlags{cert: files.Cert}
	if _, err := cf.client(); err == nil || !strings.Contains(err.Error(), "--tls-cert and --tls-key") {
		t.Fatalf("cert without key: %v", err)
	}
	cf.tls = clientTLSFlags{ca: files.Key}
	if _, err := cf.client(); err == nil || !strings.Contains(err.Error(), files.Key) || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("a key as the CA file: %v", err)
	}
}

func TestGossipKeyDecoding(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		raw := make([]byte, n)
		for i := range raw {
			raw[i] = byte(i * 7)
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			k, err := decodeGossipKey(" " + enc.EncodeToString(raw) + "\n")
			if err != nil || string(k) != string(raw) {
				t.Fatalf("%d bytes: %v", n, err)
			}
		}
	}
	secret := base64.StdEncoding.EncodeToString([]byte("twenty-bytes-secret!"))
	for _, bad := range []string{"not base64 at all!", secret} {
		_, err := decodeGossipKey(bad)
		if err == nil || strings.Contains(err.Error(), bad) {
			t.Fatalf("%q: %v (an error must not repeat the key)", bad, err)
		}
	}

	// From a file; a bad one names the file and not the content.
	dir := t.TempDir()
	path := filepath.Join(dir, "gossip.key")
	os.WriteFile(path, []byte(secret+"\n"), 0o600)
	f := serverTLSFlags{gossipKeyFile: path, clientAuth: "require"}
	_, err := f.load(slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "20 bytes") || strings.Contains(err.Error(), secret) {
		t.Fatalf("bad key file: %v", err)
	}
	good := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	os.WriteFile(path, []byte(good), 0o600)
	sec, err := f.load(slog.New(slog.DiscardHandler))
	if err != nil || string(sec.gossipKey) != "0123456789abcdef" {
		t.Fatalf("good key file: %v", err)
	}
}

// Binding beyond loopback without TLS is refused before anything starts,
// unless --insecure-plaintext; loopback stays plaintext by default.
func TestPlaintextBeyondLoopbackRefused(t *testing.T) {
	none := &serverTLSFlags{}
	if exposed, err := plaintextRefusal("127.0.0.1:7700", "localhost:7701", "[::1]:7702", none); err != nil || len(exposed) != 0 {
		t.Fatalf("loopback: %v %v", exposed, err)
	}
	_, err := plaintextRefusal("0.0.0.0:7700", "10.0.0.1:7701", ":7702", none)
	if err == nil {
		t.Fatal("non-loopback plaintext accepted")
	}
	for _, want := range []string{"HTTP API on 0.0.0.0:7700", "Raft on 10.0.0.1:7701", "gossip on :7702", "--insecure-plaintext"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	secured := &serverTLSFlags{cert: "c", key: "k", raftCA: "ca", gossipKey: "x"}
	if exposed, err := plaintextRefusal("0.0.0.0:7700", "10.0.0.1:7701", "10.0.0.1:7702", secured); err != nil || len(exposed) != 0 {
		t.Fatalf("secured: %v %v", exposed, err)
	}
	partly := &serverTLSFlags{cert: "c", key: "k"}
	if _, err := plaintextRefusal("0.0.0.0:7700", "10.0.0.1:7701", "127.0.0.1:7702", partly); err == nil ||
		strings.Contains(err.Error(), "HTTP API") || !strings.Contains(err.Error(), "Raft on") {
		t.Fatalf("HTTPS but plaintext Raft: %v", err)
	}
	if exposed, err := plaintextRefusal("0.0.0.0:7700", "10.0.0.1:7701", "10.0.0.1:7702", &serverTLSFlags{insecure: true}); err != nil || len(exposed) != 3 {
		t.Fatalf("--insecure-plaintext: %v %v", exposed, err)
	}
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "127.5.6.7:1": true, "[::1]:1": true, "localhost:1": true,
		"0.0.0.0:1": false, ":1": false, "[::]:1": false, "10.1.2.3:1": false, "myhost:1": false} {
		if isLoopback(addr) != want {
			t.Errorf("isLoopback(%q) = %v", addr, !want)
		}
	}

	// The server command refuses before it creates its data directory or
	// binds anything.
	dir := filepath.Join(t.TempDir(), "data")
	a, _, errb := testApp(nil)
	err = a.serverCmd(context.Background(), []string{"--data-dir", dir, "--http-addr", "0.0.0.0:0",
		"--raft-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "--insecure-plaintext") {
		t.Fatalf("server on 0.0.0.0 without TLS: %v", err)
	}
	if _, serr := os.Stat(dir); !os.IsNotExist(serr) {
		t.Fatalf("the refused server created its data directory (%v); log: %s", serr, errb)
	}
}

// Bad certificate and key files are refused with the flag, the file and
// the problem, never their content.
func TestKeyPairErrors(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	dir := t.TempDir()
	good := ca.WriteFiles(dir, "good", ca.Issue("server"))
	other := ca.WriteFiles(dir, "other", ca.Issue("other"))
	expired := ca.WriteFiles(dir, "expired", ca.IssueValid("old", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)))
	keyPEM, _ := os.ReadFile(good.Key)
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"missing cert", filepath.Join(dir, "nope.pem"), good.Key, []string{"--tls-cert", "nope.pem", "no such file"}},
		{"key as cert", good.Key, good.Key, []string{"--tls-cert", good.Key, "no PEM certificate"}},
		{"cert as key", good.Cert, good.Cert, []string{"--tls-key", good.Cert, "no PEM private key"}},
		{"mismatched", good.Cert, other.Key, []string{good.Cert, other.Key, "does not match"}},
		{"expired", expired.Cert, expired.Key, []string{expired.Cert, "expired on"}},
		{"directory", dir, good.Key, []string{dir, "not a regular file"}},
	} {
		_, err := loadKeyPair("--tls-cert", tc.cert, "--tls-key", tc.key, log)
		if err == nil {
			t.Fatalf("%s: accepted", tc.name)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), string(keyPEM[40:80])) {
			t.Errorf("%s: error shows key material: %q", tc.name, err)
		}
	}
	if _, err := loadCAs("--raft-tls-ca", good.Key); err == nil || !strings.Contains(err.Error(), "--raft-tls-ca "+good.Key+": no PEM certificate") {
		t.Fatalf("key as CA bundle: %v", err)
	}
	if _, err := loadKeyPair("--tls-cert", good.Cert, "--tls-key", good.Key, log); err != nil {
		t.Fatal(err)
	}
}

// A certificate replaced on disk is picked up by the next handshake (the
// files are checked at most once a second); a broken replacement keeps the
// previous certificate; reload (SIGHUP) reads at once.
func TestKeyPairReload(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	dir := t.TempDir()
	first := ca.WriteFiles(dir, "s", ca.Issue("first"))
	kp, err := loadKeyPair("--tls-cert", first.Cert, "--tls-key", first.Key, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	name := func() string {
		c, err := kp.getCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	if got := name(); got != "first" {
		t.Fatalf("loaded %q", got)
	}
	ca.WriteFiles(dir, "s", ca.Issue("second"))
	later := time.Now().Add(5 * time.Second)
	os.Chtimes(first.Cert, later, later)
	os.Chtimes(first.Key, later, later)
	eventually(t, 10*time.Second, func() bool { return name() == "second" })

	// A broken certificate file: the previous pair stays.
	os.WriteFile(first.Cert, []byte("garbage"), 0o600)
	later = later.Add(5 * time.Second)
	os.Chtimes(first.Cert, later, later)
	if err := kp.reload(); err == nil || !strings.Contains(err.Error(), first.Cert) {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if got := name(); got != "second" {
		t.Fatalf("after a failed reload: %q", got)
	}
	ca.WriteFiles(dir, "s", ca.Issue("third"))
	if err := kp.reload(); err != nil || name() != "third" {
		t.Fatalf("reload: %v, serving %q", err, name())
	}
}

// Failed TLS handshakes are logged at most once a second; other HTTP
// server errors always.
func TestHTTPErrorLogLimitsHandshakeNoise(t *testing.T) {
	var buf strings.Builder
	l := httpErrorLog(slog.New(slog.NewTextHandler(&buf, nil)))
	for i := range 50 {
		l.Printf("http: TLS handshake error from 10.0.0.%d:1234: remote error: tls: bad certificate", i)
	}
	l.Printf("http: Accept error: too many open files")
	out := buf.String()
	if n := strings.Count(out, "TLS handshake error"); n != 1 {
		t.Fatalf("%d handshake lines logged, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "Accept error") {
		t.Fatalf("other errors dropped:\n%s", out)
	}
	w := l.Writer().(*handshakeLogLimiter)
	w.mu.Lock()
	w.last = time.Time{} // as if a second had passed
	w.mu.Unlock()
	l.Printf("http: TLS handshake error from 10.0.0.99:1234: EOF")
	if out := buf.String(); !strings.Contains(out, "not_logged_before=49") {
		t.Fatalf("suppressed count not reported:\n%s", out)
	}
}
