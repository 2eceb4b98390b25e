package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
)

// TestServerLimitFlags: the count limits and HTTP hardening flags, their
// defaults, the environment, and refusals of bad values.
func TestServerLimitFlags(t *testing.T) {
	def := node.DefaultConfig()
	a, _, _ := testApp(nil)
	c, err := a.parseServerFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.node.MaxLeases != def.MaxLeases || c.node.MaxLeasesPerHolder != def.MaxLeasesPerHolder ||
		c.node.MaxSessions != def.MaxSessions || c.node.MaxSessionsPerHolder != def.MaxSessionsPerHolder ||
		c.node.MaxEventStreams != def.MaxEventStreams || c.streamsPerClient != api.DefaultMaxStreamsPerClient ||
		c.bodyTimeout != api.DefaultBodyTimeout || c.idleTimeout != 2*time.Minute {
		t.Errorf("defaults: %+v", c)
	}

	a, _, _ = testApp(map[string]string{"LEASEHOLD_MAX_SESSIONS": "7", "LEASEHOLD_HTTP_BODY_TIMEOUT": "5s"})
	c, err = a.parseServerFlags([]string{"--max-leases", "10", "--max-leases-per-holder", "0", "--max-sessions-per-holder", "3",
		"--max-event-streams", "4", "--max-event-streams-per-client", "2", "--http-idle-timeout", "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if c.node.MaxLeases != 10 || c.node.MaxLeasesPerHolder != -1 || c.node.MaxSessions != 7 || c.node.MaxSessionsPerHolder != 3 ||
		c.node.MaxEventStreams != 4 || c.streamsPerClient != 2 || c.bodyTimeout != 5*time.Second || c.idleTimeout != 30*time.Second {
		t.Errorf("set: %+v", c)
	}
	if orNegative(0) != -1 || orNegative(time.Duration(0)) != -1 || orNegative(5) != 5 {
		t.Error("orNegative: 0 must become -1 (no limit for api.Options), others stay")
	}

	for _, args := range [][]string{
		{"--max-leases", "-1"},
		{"--max-event-streams", "-3"},
		{"--max-event-streams-per-client", "-1"},
		{"--http-body-timeout", "-1s"},
		{"--http-idle-timeout", "0s"},
	} {
		a, _, _ := testApp(nil)
		_, err := a.parseServerFlags(args)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(ue.msg, "negative") && !strings.Contains(ue.msg, "positive") {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}

// TestHTTPServerLimits: the API server bounds headers (size: 431; time:
// ReadHeaderTimeout) and idle connections, and has no whole-request read or
// write timeout (which would cut event streams).
func TestHTTPServerLimits(t *testing.T) {
	cfg := serverConfig{idleTimeout: 90 * time.Second}
	log := slog.New(slog.DiscardHandler)
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(ctxKey{}) != "base" {
			t.Error("request context does not derive from the base context")
		}
		w.WriteHeader(http.StatusNoContent)
	}), cfg, context.WithValue(context.Background(), ctxKey{}, "base"), log)
	if srv.ReadHeaderTimeout != httpReadHeaderTimeout || srv.MaxHeaderBytes != httpMaxHeaderBytes ||
		srv.IdleTimeout != 90*time.Second || srv.ReadTimeout != 0 || srv.WriteTimeout != 0 {
		t.Fatalf("server limits: header timeout %v, header bytes %d, idle %v, read %v, write %v",
			srv.ReadHeaderTimeout, srv.MaxHeaderBytes, srv.IdleTimeout, srv.ReadTimeout, srv.WriteTimeout)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	do := func(extra string) int {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		// Written concurrently: the server may answer (and stop reading)
		// before a too large header is all sent.
		go io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"+extra+"\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := do("X-Small: " + strings.Repeat("a", 1000) + "\r\n"); got != http.StatusNoContent {
		t.Fatalf("small headers: %d", got)
	}
	if got := do("X-Big: " + strings.Repeat("a", httpMaxHeaderBytes+8192) + "\r\n"); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("headers over %d bytes: %d, want 431", httpMaxHeaderBytes, got)
	}
}

type ctxKey struct{}

// TestServerFlagZeros: a flag whose 0 says "no limit" or "off" reaches
// node.Config as -1 (node's zero means the default), a negative one is
// refused, and the flags whose 0 was refused or meant Raft's default keep
// that meaning.
func TestServerFlagZeros(t *testing.T) {
	a, _, _ := testApp(nil)
	c, err := a.parseServerFlags([]string{"--state-check-interval", "0", "--grant-key-retention", "0s", "--join-timeout", "0",
		"--dead-server-timeout", "0", "--max-retained", "0", "--max-waiters-per-key", "0", "--snapshot-interval", "0"})
	if err != nil {
		t.Fatal(err)
	}
	n := c.node
	if n.StateCheckInterval != -1 || n.GrantKeyRetention != -1 || n.JoinTimeout != -1 || n.DeadServerTimeout != -1 ||
		n.MaxRetained != -1 || n.MaxWaitersPerKey != -1 || n.SnapshotInterval != 2*time.Minute {
		t.Errorf("zeros: state check %v, grant key retention %v, join timeout %v, dead server timeout %v, max retained %d, waiters per key %d, snapshot interval %v",
			n.StateCheckInterval, n.GrantKeyRetention, n.JoinTimeout, n.DeadServerTimeout, n.MaxRetained, n.MaxWaitersPerKey, n.SnapshotInterval)
	}
	def := node.DefaultConfig()
	a, _, _ = testApp(nil)
	if c, err = a.parseServerFlags(nil); err != nil {
		t.Fatal(err)
	}
	if c.node.StateCheckInterval != def.StateCheckInterval || c.node.JoinTimeout != def.JoinTimeout || c.node.MaxRetained != def.MaxRetained {
		t.Errorf("defaults changed: %v %v %d", c.node.StateCheckInterval, c.node.JoinTimeout, c.node.MaxRetained)
	}
	for _, args := range [][]string{
		{"--state-check-interval", "-1s"},
		{"--grant-key-retention", "-1s"},
		{"--join-timeout", "-1s"},
		{"--dead-server-timeout", "-1m"},
		{"--max-retained", "-1"},
		{"--tick-period", "0"},
		{"--retention", "0"},
	} {
		a, _, _ := testApp(nil)
		_, err := a.parseServerFlags(args)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}

// TestServerRaftTimeoutFlag: --raft-timeout (and LEASEHOLD_RAFT_TIMEOUT)
// reaches node.Config.RaftTimeout; its default is node's own 500ms; a value
// outside 50ms-1m is a usage error that names the flag.
func TestServerRaftTimeoutFlag(t *testing.T) {
	a, _, _ := testApp(nil)
	c, err := a.parseServerFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.node.RaftTimeout != 500*time.Millisecond {
		t.Errorf("default raft timeout %v, want 500ms", c.node.RaftTimeout)
	}
	a, _, _ = testApp(nil)
	if c, err = a.parseServerFlags([]string{"--raft-timeout", "2s"}); err != nil || c.node.RaftTimeout != 2*time.Second {
		t.Errorf("--raft-timeout 2s: %v %v", c.node.RaftTimeout, err)
	}
	a, _, _ = testApp(map[string]string{"LEASEHOLD_RAFT_TIMEOUT": "750ms"})
	if c, err = a.parseServerFlags(nil); err != nil || c.node.RaftTimeout != 750*time.Millisecond {
		t.Errorf("LEASEHOLD_RAFT_TIMEOUT=750ms: %v %v", c.node.RaftTimeout, err)
	}
	for _, v := range []string{"0", "-1s", "10ms", "49ms", "61s", "1h"} {
		a, _, _ := testApp(nil)
		_, err := a.parseServerFlags([]string{"--raft-timeout", v})
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--raft-timeout") {
			t.Errorf("--raft-timeout %s: err = %v, want a usage error naming the flag", v, err)
		}
	}
	for _, v := range []string{"50ms", "1m"} {
		a, _, _ := testApp(nil)
		if _, err := a.parseServerFlags([]string{"--raft-timeout", v}); err != nil {
			t.Errorf("--raft-timeout %s: %v", v, err)
		}
	}
}
