package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestGrantCommands: against a real node, 'acquire --grant' and 'grant'
// print grants; 'keys --json' saves the key set; 'verify' accepts the
// grants with the keys from the server or from the file, and refuses an
// altered grant and one of another cluster (exit 1); bad input is a usage
// error (exit 2); 'keygen --grant' prints a key that loads.
func TestGrantCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr, cfg.GossipAddr = true, "", "", "127.0.0.1:0"
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.FromNode(n), api.Options{}))
	t.Cleanup(func() { srv.Close(); n.Close() })
	env := map[string]string{"LEASEHOLD_ADDR": srv.URL}
	ctx := context.Background()
	run := func(args ...string) (int, string, string) {
		t.Helper()
		a, out, errb := testApp(env)
		code := report(a.run(ctx, args), errb)
		return code, out.String(), errb.String()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, out, _ := run("keys")
		if code == 0 && strings.Contains(out, n.GrantKeyID()) {
			if !strings.Contains(out, "current") || !strings.Contains(out, "cluster_id") {
				t.Fatalf("keys: %s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key set never listed the node's key: %d %s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	code, out, errs := run("acquire", "--grant", "--holder", "w1", "--ttl", "30s", "--json", "printer")
	var l wire.Lease
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.Grant == "" {
		t.Fatalf("acquire --grant: %d %s %s", code, out, errs)
	}
	if code, out, _ := run("acquire", "--grant", "--holder", "w1", "--ttl", "30s", "scanner"); code != 0 || !strings.Contains(out, "grant ") {
		t.Fatalf("acquire --grant readable: %d %s", code, out)
	}
	code, out, errs = run("grant", "--lease-token", l.Token, l.LeaseID)
	g := strings.TrimSpace(out)
	if code != 0 || strings.Count(g, ".") != 2 {
		t.Fatalf("grant: %d %q %s", code, out, errs)
	}
	code, out, _ = run("renew", "--grant", "--lease-token", l.Token, "--json", l.LeaseID)
	var r wire.Lease
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Grant == "" || r.RenewalCount != 1 {
		t.Fatalf("renew --grant: %d %s", code, out)
	}

	code, out, _ = run("keys", "--json")
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	if code != 0 {
		t.Fatalf("keys --json: %d %s", code, out)
	}
	os.WriteFile(keysFile, []byte(out), 0o644)
	ks, err := grant.ParseKeySet([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"verify", g}, {"verify", "--keys", keysFile, g}, {"verify", "--keys", keysFile, r.Grant}, {"verify", "--keys", keysFile, l.Grant}} {
		code, out, errs := run(args...)
		if code != 0 || !strings.HasPrefix(out, "valid\n") || !strings.Contains(out, "fencing_token") || !strings.Contains(out, "printer") {
			t.Fatalf("%v: %d %s %s", args[:len(args)-1], code, out, errs)
		}
	}
	code, out, _ = run("verify", "--json", "--keys", keysFile, g)
	var v struct {
		Valid  bool
		Claims grant.Claims
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !v.Valid || v.Claims.FencingToken != l.FencingToken || v.Claims.ClusterID != ks.ClusterID {
		t.Fatalf("verify --json: %d %s", code, out)
	}

	// Refused grants: exit 1 with the reason.
	p := strings.Split(g, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(p[1])
	raised := strings.Replace(string(payload), fmt.Sprintf(`"fencing_token":%d`, l.FencingToken), `"fencing_token":999999`, 1)
	if raised == string(payload) {
		t.Fatalf("no fencing token in %s", payload)
	}
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"altered":         {[]string{"verify", "--keys", keysFile, p[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(raised)) + "." + p[2]}, "bad signature"},
		"another cluster": {[]string{"verify", "--keys", keysFile, "--cluster-id", "someone-else", g}, "another cluster"},
		"not a grant":     {[]string{"verify", "--keys", keysFile, "hello"}, "malformed"},
	} {
		code, out, _ := run(c.args...)
		if code != exitFailure || !strings.HasPrefix(out, "invalid: ") || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, %q", name, code, out)
		}
	}
	// Usage errors: exit 2.
	for _, args := range [][]string{{"verify"}, {"verify", "a", "b"}, {"verify", "--keys", filepath.Join(t.TempDir(), "none"), g},
		{"verify", "--keys", "/dev/null", g}, {"verify", "--leeway", "-1s", g}, {"grant", l.LeaseID}, {"keys", "extra"}} {
		if code, _, errs := run(args...); code != exitUsage {
			t.Errorf("%v: exit %d (%s), want %d", args, code, errs, exitUsage)
		}
	}
	if code, _, _ := run("grant", "--lease-token", "wrong", l.LeaseID); code != exitDenied {
		t.Errorf("grant with a wrong token: exit %d", code)
	}

	code, out, _ = run("keygen", "--grant")
	if code != 0 {
		t.Fatalf("keygen --grant: %d", code)
	}
	if _, err := grant.ParsePrivateKey([]byte(out)); err != nil {
		t.Fatalf("keygen --grant printed a key that does not load: %v", err)
	}
}

// TestGrantKeyFileFlag: --grant-key-file loads a PEM key, warns when the
// file is readable by everyone, and names the flag and the file (never the
// key) when it cannot be used.
func TestGrantKeyFileFlag(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	good := filepath.Join(dir, "grant.key")
	pemBytes := grant.MarshalPrivateKey(grant.GenerateKey())
	os.WriteFile(good, pemBytes, 0o644)
	k, err := loadGrantKeyFile(good, log)
	if err != nil || len(k) == 0 {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "readable by every user") {
		t.Fatalf("no warning about a world-readable key: %s", logs.String())
	}
	bad := filepath.Join(dir, "bad.key")
	os.WriteFile(bad, append(pemBytes[:40:40], "garbage"...), 0o600)
	for _, p := range []string{bad, filepath.Join(dir, "missing.key")} {
		_, err := loadGrantKeyFile(p, log)
		if err == nil || !strings.Contains(err.Error(), "--grant-key-file") || strings.Contains(err.Error(), string(pemBytes[28:40])) {
			t.Errorf("%s: %v", p, err)
		}
	}
	if strings.Contains(logs.String(), string(pemBytes[28:60])) {
		t.Fatal("the log shows the key")
	}
}
