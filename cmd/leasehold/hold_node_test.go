package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
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
		_, err := c.List(context.Background(), wire.ListRequest{})
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
	t.Parallel() // a node of its own; mostly waiting on TTLs
	c, _ := startTestNode(t)
	ctx := context.Background()
	blocker, err := c.Acquire(ctx, wire.AcquireRequest{Key: "K", Holder: "blocker", TTLMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(4 * time.Second) // longer than the TTL (3 s): the wait under test
		_, _ = c.Release(ctx, wire.ReleaseRequest{LeaseID: blocker.LeaseID, Token: blocker.Token})
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
	ls, err := c.List(ctx, wire.ListRequest{Key: "K", State: "active"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Leases) != 0 {
		t.Errorf("K still held after hold: %+v", ls.Leases[0])
	}
}

// TestLockWaitsRunsAndReleases: lock waits for a held key by default (here
// past the session's TTL), runs the command with the fencing token, and
// frees the key; --no-wait fails at once on a held key.
func TestLockWaitsRunsAndReleases(t *testing.T) {
	t.Parallel() // a node of its own; mostly waiting on TTLs
	c, _ := startTestNode(t)
	ctx := context.Background()
	blocker, err := c.Acquire(ctx, wire.AcquireRequest{Key: "K", Holder: "blocker", TTLMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	// Long enough that a loaded machine's late heartbeat does not lose
	// the session while lock waits.
	const sessionTTL = 3 * time.Second
	run := func(noWait bool, limit uint32) (string, error) {
		var out, errb bytes.Buffer
		err := lockRun(ctx, c, lockOptions{holdOptions: holdOptions{
			key: "K", holder: "h", ttl: sessionTTL, limit: limit,
			command: []string{"sh", "-c", "echo token=$LEASEHOLD_FENCING_TOKEN"}, stdin: strings.NewReader(""),
			stdout: &out, stderr: &errb,
		}, noWait: noWait}, make(chan os.Signal))
		return out.String(), err
	}
	if _, err := run(true, 0); err == nil || !strings.Contains(err.Error(), "LEASE_HELD") {
		t.Fatalf("--no-wait on a held key: %v, want LEASE_HELD", err)
	}
	go func() {
		time.Sleep(2 * sessionTTL) // twice the lock's session TTL: the wait under test
		_, _ = c.Release(ctx, wire.ReleaseRequest{LeaseID: blocker.LeaseID, Token: blocker.Token})
	}()
	out, err := run(false, 0)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	tok, perr := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(out, "token="), "\n"), 10, 64)
	if perr != nil || tok <= blocker.FencingToken {
		t.Errorf("command output %q, want a fencing token above the blocker's %d", out, blocker.FencingToken)
	}
	ls, err := c.List(ctx, wire.ListRequest{Key: "K", State: "active"})
	if err != nil || len(ls.Leases) != 0 {
		t.Fatalf("K after lock: %v %+v", err, ls)
	}
	// A semaphore of two slots admits lock next to another holder.
	other, err := c.Acquire(ctx, wire.AcquireRequest{Key: "K", Holder: "other", TTLMS: 30_000, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(true, 2); err != nil {
		t.Fatalf("lock --limit 2 --no-wait next to one holder: %v", err)
	}
	_, _ = c.Release(ctx, wire.ReleaseRequest{LeaseID: other.LeaseID, Token: other.Token})
}

// TestKeepAliveCommand keeps a lease alive past its TTL, then reports its
// loss (exit 1) once an operator revokes it.
func TestKeepAliveCommand(t *testing.T) {
	t.Parallel() // a node of its own; mostly waiting on TTLs
	c, url := startTestNode(t)
	ctx := context.Background()
	// A TTL that a loaded machine's late renewal does not lose (the
	// command renews at a third of it).
	const ttl = 5 * time.Second
	start := time.Now()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "ka", Holder: "h", TTLMS: ttl.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, lookupEnv: func(string) (string, bool) { return "", false }}
	done := make(chan error, 1)
	go func() {
		done <- a.run(ctx, []string{"keep-alive", "--addr", url, "--lease-token", l.Token, l.LeaseID})
	}()
	// Alive past its TTL, renewed at least twice.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("keep-alive ended before the revocation: %v (stderr %q)", err, errb.String())
		default:
		}
		got, err := c.Get(ctx, l.LeaseID)
		if err != nil || got.State != "active" {
			t.Fatalf("lease under keep-alive, %v after the acquire: %v %+v", time.Since(start), err, got)
		}
		if got.RenewalCount >= 2 && time.Since(start) > ttl+time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %d renewals", got.RenewalCount)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Revoke(ctx, l.LeaseID, "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if exitCode(err) != 1 || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("keep-alive ended with %v, want exit 1 for a lost lease", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("keep-alive did not notice the revocation")
	}
}

// TestLockStopsCommandOnRevoke: an operator revokes the lock's lease while
// the session lives on; lock stops the command and exits 1 rather than let
// it run while another holder can take the key.
func TestLockStopsCommandOnRevoke(t *testing.T) {
	t.Parallel() // a node of its own; mostly waiting on TTLs
	c, _ := startTestNode(t)
	ctx := context.Background()
	var out, errb bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- lockRun(ctx, c, lockOptions{holdOptions: holdOptions{
			key: "rv", holder: "h", ttl: 10 * time.Second,
			command: []string{"sh", "-c", "echo started; sleep 60"}, stdin: strings.NewReader(""),
			stdout: syncWriter(&out), stderr: syncWriter(&errb),
		}}, make(chan os.Signal))
	}()
	var lease *wire.Lease
	deadline := time.Now().Add(30 * time.Second)
	for lease == nil {
		if time.Now().After(deadline) {
			t.Fatal("lock never took rv")
		}
		ls, err := c.List(ctx, wire.ListRequest{Key: "rv", State: "active"})
		if err == nil && len(ls.Leases) == 1 {
			lease = ls.Leases[0]
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := c.Revoke(ctx, lease.LeaseID, "ops"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(errb.String(), "revoked") {
			t.Fatalf("lock after a revoke: %v; stderr %q", err, errb.String())
		}
	case <-time.After(40 * time.Second): // the command sleeps 60 s
		t.Fatalf("lock still runs its command 40 s after its lease was revoked; stderr %q", errb.String())
	}
}
