package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestSnapshotCommands: save, inspect and restore against a real in-memory
// node behind the HTTP API.
func TestSnapshotCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("node not ready")
	}
	srv := httptest.NewServer(api.New(api.FromNode(n), api.Options{}))
	t.Cleanup(srv.Close)
	env := map[string]string{"LEASEHOLD_ADDR": srv.URL}
	ctx := context.Background()
	run := func(args ...string) (string, string, int) {
		a, out, errb := testApp(env)
		code := report(a.run(ctx, args), errb)
		return out.String(), errb.String(), code
	}

	var kept *wire.Lease
	deadline := time.Now().Add(5 * time.Second)
	for kept == nil {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "a", TTLMS: 60000})
		if err == nil {
			kept = l
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "backup.snapshot")
	out, errs, code := run("snapshot", "save", file)
	if code != 0 || !strings.Contains(out, "index") || !strings.Contains(out, "term") || !strings.Contains(out, "bytes") {
		t.Fatalf("save: exit %d\n%s%s", code, out, errs)
	}
	if _, err := os.Stat(file + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	out, errs, code = run("snapshot", "inspect", "--json", file)
	var info node.SnapshotInfo
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || info.State == nil || info.State.ActiveLeases != 1 {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, errs)
	}

	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: kept.LeaseID, Token: kept.Token}); err != nil {
		t.Fatal(err)
	}
	// Without --yes nothing happens.
	if _, errs, code = run("snapshot", "restore", file); code != 2 || !strings.Contains(errs, "--yes") {
		t.Fatalf("restore without --yes: exit %d: %s", code, errs)
	}
	// A damaged file is refused before it is sent.
	bad := filepath.Join(t.TempDir(), "bad.snapshot")
	data, _ := os.ReadFile(file)
	data[len(data)-1] ^= 1
	os.WriteFile(bad, data, 0o600)
	if _, errs, code = run("snapshot", "restore", "--yes", bad); code != exitUsage || !strings.Contains(errs, "checksum") {
		t.Fatalf("restore of a damaged file: exit %d: %s", code, errs)
	}
	if l, _ := n.GetLease(ctx, kept.LeaseID, false); l == nil || l.State != "released" {
		t.Fatalf("state changed before the real restore: %+v", l)
	}

	out, errs, code = run("snapshot", "restore", "--yes", "--json", file)
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || info.RestoredIndex == 0 {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errs)
	}
	if l, err := n.GetLease(ctx, kept.LeaseID, false); err != nil || l.State != "active" {
		t.Fatalf("after restore: %v %+v", err, l)
	}

	if _, errs, code = run("snapshot", "frobnicate"); code != 2 {
		t.Fatalf("unknown subcommand: exit %d: %s", code, errs)
	}
	if _, errs, code = run("snapshot", "save", filepath.Join(t.TempDir(), "missing-dir", "x")); code != 1 {
		t.Fatalf("save into a missing directory: exit %d: %s", code, errs)
	}
}
