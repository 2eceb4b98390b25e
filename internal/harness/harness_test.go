package harness_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/harness"
	"github.com/leasehold/leasehold/node"
)

// TestClusterLifecycle drives three servers on TCP through what the
// harness offers: start them together, wait for one ready leader and three
// voters, refuse a second server of a running id, stop the leader (and
// refuse to stop it twice), find the next leader without it, start it
// again, and keep the servers' log lines.
func TestClusterLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("GAP under -short: starts a three-server cluster")
	}
	h := harness.New(harness.Options[node.Config, *node.Node]{
		Open: func(cfg node.Config, logs io.Writer) (*node.Node, error) {
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)).With("server", cfg.NodeID)
			return node.Open(cfg)
		},
		TailLines: 50,
	})
	ids := []string{"h1", "h2", "h3"}
	addrs, err := harness.FreeAddrs(2 * len(ids))
	if err != nil {
		t.Fatal(err)
	}
	gossip := addrs[len(ids):]
	cfgs := map[string]node.Config{}
	var all []node.Config
	for i, id := range ids {
		cfg := node.DefaultConfig()
		cfg.NodeID, cfg.DataDir = id, t.TempDir()
		cfg.RaftAddr, cfg.GossipAddr = addrs[i], gossip[i]
		cfg.BootstrapExpect, cfg.Join = 3, gossip
		cfg.TickPeriod = 50 * time.Millisecond
		cfg.RaftTimeout = time.Second
		cfgs[id] = cfg
		all = append(all, cfg)
	}
	// Registered after the data directories (t.TempDir): cleanups run
	// last-registered first, so the servers stop before their directories go.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines:\n%s", h.Tail())
		}
		h.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	servers, err := h.StartAll(all...)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		if s.NodeID() != ids[i] {
			t.Fatalf("StartAll returned %s at %d, want %s", s.NodeID(), i, ids[i])
		}
	}
	if err := h.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.WaitVoters(ctx, 3); err != nil {
		t.Fatal(err)
	}
	l, err := h.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A second server of a running id is refused (here its data directory
	// is locked before the harness sees the id); the first runs on.
	if _, err := h.Start(cfgs[l.NodeID()]); err == nil {
		t.Fatalf("a second %s started", l.NodeID())
	}
	if s, ok := h.Server(l.NodeID()); !ok || s != l || l.ReadyErr() != nil {
		t.Fatalf("after the refused start, %s: %v %v", l.NodeID(), ok, l.ReadyErr())
	}
	// Raft on TCP: cutting traffic is the caller's business.
	if err := h.Isolate(l.NodeID()); err == nil {
		t.Fatal("Isolate of a server on TCP succeeded")
	}

	// Stop the leader: the others elect one of themselves.
	old := l.NodeID()
	if err := h.Stop(old); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Server(old); ok {
		t.Fatalf("%s still listed after Stop", old)
	}
	if err := h.Stop(old); !errors.Is(err, harness.ErrNotRunning) {
		t.Fatalf("a second Stop: %v, want ErrNotRunning", err)
	}
	next, err := h.WaitLeader(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if next.NodeID() == old {
		t.Fatalf("WaitLeader excluding %s returned it", old)
	}

	// Started again from its configuration (its data directory kept), it
	// rejoins and every server is ready.
	back, err := h.Start(cfgs[old])
	if err != nil {
		t.Fatal(err)
	}
	if back.NodeID() != old {
		t.Fatalf("restarted %s as %s", old, back.NodeID())
	}
	if err := h.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.WaitVoters(ctx, 3); err != nil {
		t.Fatal(err)
	}

	tail := h.Tail()
	if n := strings.Count(tail, "\n") + 1; n > 50 {
		t.Fatalf("Tail kept %d lines, want at most 50", n)
	}
	if !strings.Contains(tail, "server=") {
		t.Fatalf("Tail holds none of the servers' lines:\n%s", tail)
	}
}

// TestWaitGivesTheLastReason: a wait that ends with its context says what
// it waited for and what it saw last.
func TestWaitGivesTheLastReason(t *testing.T) {
	h := harness.New(harness.Options[node.Config, *node.Node]{
		Open: func(cfg node.Config, _ io.Writer) (*node.Node, error) { return node.Open(cfg) },
	})
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := h.WaitLeader(ctx)
	if err == nil || !strings.Contains(err.Error(), "a single ready leader") || !strings.Contains(err.Error(), "0 ready leaders") {
		t.Fatalf("WaitLeader on an empty cluster: %v", err)
	}
}

// TestFreeAddrs: distinct loopback ports below the ephemeral range, each
// free for TCP and UDP when returned.
func TestFreeAddrs(t *testing.T) {
	addrs, err := harness.FreeAddrs(20)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 20 {
		t.Fatalf("%d addresses, want 20", len(addrs))
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q: %v", a, err)
		}
		p, _ := strconv.Atoi(port)
		if p < 20000 || p >= 32768 {
			t.Fatalf("port %d outside [20000, 32768)", p)
		}
		if seen[a] {
			t.Fatalf("%s returned twice", a)
		}
		seen[a] = true
	}
	// Bindable for both protocols (nothing else on this machine should
	// have taken one in the meantime; a busy machine's ephemeral ports
	// start at 32768).
	l, err := net.Listen("tcp", addrs[0])
	if err != nil {
		t.Fatalf("TCP on %s: %v", addrs[0], err)
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addrs[0])
	if err != nil {
		t.Fatalf("UDP on %s: %v", addrs[0], err)
	}
	u.Close()
}
