package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
)

// startTestNode runs a single in-memory node with the API on loopback and
// returns a client for it.
func startTestNode(t *testing.T) (*client.Client, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.TickPeriod = 50 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.FromNode(n), api.Options{}))
	t.Cleanup(func() { n.Close() })
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() bool {
		_, err := c.List(context.Background(), node.ListRequest{})
		return err == nil
	})
	return c, srv.URL
}

// TestHoldAfterWaitingLongerThanTTL is the reported misfire: a blocker
// holds K for 4 s; hold --ttl 3s --wait 10s K -- echo ran waited, then
// said "acquired but not renewable in time" and never ran the command (its
// own copy of the deadline logic gave the first renewal a deadline already
// past). On the client's keep-alive it renews first and runs the command.
func TestHoldAfterWaitingLongerThanTTL(t *testing.T) {
	c, _ := startTestNode(t)
	ctx := context.Background()
	blocker, err := c.Acquire(ctx, node.AcquireRequest{Key: "K", Holder: "blocker", TTLMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(4 * time.Second)
		_, _ = c.Release(ctx, node.ReleaseRequest{LeaseID: blocker.LeaseID, Token: blocker.Token})
	}()
	var out, errb bytes.Buffer
	err = holdRun(ctx, c, holdOptions{
		key: "K", holder: "h", ttl: 3 * time.Second, wait: 10 * time.Second,
		command: []string{"echo", "ran"}, stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
	}, make(chan os.Signal))
	if err != nil {
		t.Fatalf("hold: %v (stderr %q)", err, errb.String())
	}
	if out.String() != "ran\n" {
		t.Fatalf("command output %q, want %q", out.String(), "ran\n")
	}
	ls, err := c.List(ctx, node.ListRequest{Key: "K", State: "active"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Leases) != 0 {
		t.Errorf("K still held after hold: %+v", ls.Leases[0])
	}
}
