package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// TestHoldGrantFile: hold --grant-file writes the lease's grant before the
// command starts and rewrites it (atomically) at each renewal: the command
// reads a verifying grant of its lease at once and a newer one later; the
// file is gone when hold ends and no temporary file is left behind.
func TestHoldGrantFile(t *testing.T) {
	c, _ := startTestNode(t)
	ctx := context.Background()
	// Until the node's grant key is recorded, grants are refused (503).
	eventually(t, 30*time.Second, func() bool {
		l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "probe", Holder: "p", TTLMS: 5000, Grant: true})
		if err != nil {
			return false
		}
		_, _ = c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
		return l.Grant != ""
	})
	dir := t.TempDir()
	gf := filepath.Join(dir, "grant.jwt")
	script := `cp "$LEASEHOLD_GRANT_FILE" first; echo "$LEASEHOLD_FENCING_TOKEN" > token; ` +
		// Until the file's grant differs from the first one (a renewal
		// rewrote it; iat has one-second resolution), at most 20 s.
		`i=0; while cmp -s "$LEASEHOLD_GRANT_FILE" first && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; cp "$LEASEHOLD_GRANT_FILE" last`
	var out, errb bytes.Buffer
	err := holdRun(ctx, c, holdOptions{
		key: "camera/7", holder: "worker-7", ttl: time.Second, grantFile: gf,
		command: []string{"sh", "-c", "cd " + dir + " && " + script}, stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
	}, make(chan os.Signal))
	if err != nil {
		t.Fatalf("hold: %v (stderr %q)", err, errb.String())
	}
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	first, last, token := read("first"), read("last"), read("token")
	if first == last {
		t.Fatal("the grant file was not rewritten during the command")
	}
	// exp is an estimate (iat + remaining, here under a second): the
	// signature and claims are what is checked.
	v := c.GrantVerifier(grant.VerifierOptions{VerifyOptions: grant.VerifyOptions{Leeway: time.Hour}})
	var leaseID string
	for i, g := range []string{first, last} {
		cl, err := v.Verify(ctx, g)
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if cl.Key != "camera/7" || cl.Holder != "worker-7" || token != strconv.FormatUint(cl.FencingToken, 10) {
			t.Fatalf("grant %d: %+v (fencing token in the environment %s)", i, cl, token)
		}
		if leaseID == "" {
			leaseID = cl.LeaseID
		} else if cl.LeaseID != leaseID {
			t.Fatalf("grants of two leases: %s, %s", leaseID, cl.LeaseID)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "first,last,token" {
		t.Fatalf("left in the directory: %v (the grant file is removed when hold ends, no temporary file stays)", names)
	}
}
