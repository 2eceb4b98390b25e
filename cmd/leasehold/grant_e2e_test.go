package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestProcessGrantKeyRotation: a server makes its grant key in its data
// directory at first start (0600, PKCS #8 PEM); restarted with
// --grant-key-file holding another key (a rotation) it signs with that
// one, and GET /v1/keys lists both, the old one retired, so that a grant
// signed before the rotation still verifies; with --grant-key-retention
// short, the old key leaves the set and its grants fail. A bad key file
// stops the server with an error naming the flag, never the key. The log
// never shows a private key.
func TestProcessGrantKeyRotation(t *testing.T) {
	t.Parallel()
	// Long enough that a loaded machine's restart and first looks at the
	// key set fit in it (the old key must still be there), short enough
	// to wait out.
	const retention = 15 * time.Second
	s := newServer(t, "--grant-key-retention", retention.String())
	s.start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := s.client(t)
	waitKeys := func(n int) *grant.KeySet {
		t.Helper()
		var ks *grant.KeySet
		eventually(t, retention+30*time.Second, func() bool {
			var err error
			ks, err = c.Keys(ctx)
			return err == nil && len(ks.Keys) == n
		})
		return ks
	}
	ks1 := waitKeys(1)
	keyFile := filepath.Join(s.dataDir, "grant.key")
	st, err := os.Stat(keyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("grant.key: %v %v", st, err)
	}
	priv1, err := grant.LoadKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if grant.Thumbprint(priv1.Public().(ed25519.PublicKey)) != ks1.Keys[0].Kid {
		t.Fatalf("the key set's kid %s is not grant.key's", ks1.Keys[0].Kid)
	}
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "vault", Holder: "w1", TTLMS: 120000, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}

	// Rotation: another key, from a file.
	a, out, _ := testApp(nil)
	if err := a.run(ctx, []string{"keygen", "--grant"}); err != nil {
		t.Fatal(err)
	}
	newKey := filepath.Join(t.TempDir(), "grant-2.key")
	if err := os.WriteFile(newKey, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	s.extra = append(s.extra, "--grant-key-file", newKey)
	s.start()
	ks := waitKeys(2)
	priv2, _ := grant.LoadKeyFile(newKey)
	kid2 := grant.Thumbprint(priv2.Public().(ed25519.PublicKey))
	if ks.Keys[0].Kid != kid2 || ks.Keys[0].RetiredAt != nil || ks.Keys[1].Kid != ks1.Keys[0].Kid || ks.Keys[1].RetiredAt == nil {
		t.Fatalf("key set after the rotation: %+v", ks)
	}
	v := c.GrantVerifier(grant.VerifierOptions{MaxAge: time.Second, MinRefetch: 100 * time.Millisecond})
	if _, err := v.Verify(ctx, l.Grant); err != nil {
		t.Fatalf("a grant from before the rotation: %v", err)
	}
	g, err := c.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token})
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := grant.Parse(g.Grant); tok.KeyID != kid2 {
		t.Fatalf("signed by %s after the rotation, want %s", tok.KeyID, kid2)
	}
	// Past the retention the old key is gone.
	waitKeys(1)
	// The verifier refetches the key set once its copy is older than
	// MaxAge (1 s): from then on it knows the old key no more.
	eventually(t, 30*time.Second, func() bool {
		_, err := v.Verify(ctx, l.Grant)
		return errors.Is(err, grant.ErrUnknownKey)
	})
	if _, err := v.Verify(ctx, g.Grant); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.log(), "grant_kid="+kid2) {
		t.Errorf("the start line does not name the key id")
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}

	// A bad key file: the server does not start.
	bad := filepath.Join(t.TempDir(), "bad.key")
	os.WriteFile(bad, []byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n-----END PRIVATE KEY-----\n"), 0o600)
	cmd := exec.Command(s.bin, "server", "--node-id", s.nodeID, "--data-dir", s.dataDir, "--http-addr", s.http,
		"--raft-addr", s.raft, "--gossip-addr", s.gossip, "--grant-key-file", bad)
	badOut, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(badOut), "--grant-key-file") || strings.Contains(string(badOut), "MC4CAQAw") {
		t.Fatalf("a bad key file: %v\n%s", err, badOut)
	}

	for _, k := range [][]byte{priv1.Seed(), priv2.Seed()} {
		for _, s64 := range []string{base64.StdEncoding.EncodeToString(k), base64.RawURLEncoding.EncodeToString(k)} {
			if strings.Contains(s.log(), s64) {
				t.Fatal("the server's log shows a private key")
			}
		}
	}
	if strings.Contains(s.log(), "PRIVATE KEY") {
		t.Fatal("the server's log shows a PEM private key")
	}
}
