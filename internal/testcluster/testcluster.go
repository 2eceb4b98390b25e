// Package testcluster starts real Leasehold clusters in the test process:
// three nodes on loopback with an HTTP handler in front of each (the API,
// which the caller builds: this package does not import api, so api's own
// tests use it too). The cluster is an internal/harness one.
package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/harness"
	"github.com/leasehold/leasehold/node"
)

// Member is one node of the cluster with the API in front of it.
type Member struct {
	ID string
	*node.Node
	// Addr is the API's base URL.
	Addr string
	srv  *http.Server
	h    *harness.Cluster[node.Config, *Member]
	once sync.Once
	err  error
}

// Stop closes the member's API and node (a crash, as far as the other
// members can tell); calling it again is harmless.
func (m *Member) Stop() { m.h.Stop(m.ID) }

// Close closes the member's API and node once (the harness's Stop and
// Close call it).
func (m *Member) Close() error {
	m.once.Do(func() {
		m.srv.Close()
		m.err = m.Node.Close()
	})
	return m.err
}

// Handler builds what a member serves over HTTP, typically
// api.New(api.FromNode(n), api.Options{}).
type Handler func(n *node.Node) http.Handler

// Start forms a three-node cluster (bootstrap-expect 3) whose nodes serve
// handler, and waits, up to 60 s, for every node to know a leader. The
// members stop at the end of the test (their last log lines are logged if
// it failed). Skipped with -short.
func Start(t testing.TB, handler Handler) []*Member {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	var h *harness.Cluster[node.Config, *Member]
	h = harness.New(harness.Options[node.Config, *Member]{
		Open: func(cfg node.Config, logs io.Writer) (*Member, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			cfg.HTTPAddr = ln.Addr().String()
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)).With("server", cfg.NodeID)
			n, err := node.Open(cfg)
			if err != nil {
				ln.Close()
				return nil, fmt.Errorf("open %s: %w", cfg.NodeID, err)
			}
			m := &Member{ID: cfg.NodeID, Node: n, Addr: "http://" + ln.Addr().String(), h: h,
				srv: &http.Server{Handler: handler(n), ReadHeaderTimeout: 10 * time.Second}}
			go m.srv.Serve(ln)
			return m, nil
		},
		Ready: func(m *Member) error {
			if err := m.ReadyErr(); err != nil {
				return err
			}
			if _, ok := m.Leader(); !ok {
				return errors.New("no leader known")
			}
			return nil
		},
	})
	ids := []string{"c1", "c2", "c3"}
	addrs, err := harness.FreeAddrs(2 * len(ids))
	if err != nil {
		t.Fatal(err)
	}
	gossip := addrs[len(ids):]
	cfgs := make([]node.Config, len(ids))
	for i, id := range ids {
		cfg := node.DefaultConfig()
		cfg.NodeID, cfg.DataDir = id, t.TempDir()
		cfg.RaftAddr, cfg.GossipAddr = addrs[i], gossip[i]
		cfg.BootstrapExpect, cfg.Join = 3, gossip
		cfg.TickPeriod = 50 * time.Millisecond
		// Raft's default 500 ms (a 250 ms leader lease) lets a saturated
		// machine depose leaders at random.
		cfg.RaftTimeout = time.Second
		cfgs[i] = cfg
	}
	// Registered after the data directories (t.TempDir): cleanups run
	// last-registered first, so the servers stop before their directories go.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines of the cluster's servers:\n%s", h.Tail())
		}
		h.Close()
	})
	ms, err := h.StartAll(cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.WaitReady(ctx); err != nil {
		t.Fatalf("a leader known to every node: %v", err)
	}
	return ms
}

// Addrs returns the members' API base URLs.
func Addrs(ms []*Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Addr)
	}
	return out
}

// Leader returns the member that is the leader, nil if none of ms is.
func Leader(ms []*Member) *Member {
	for _, m := range ms {
		if info, ok := m.Node.Leader(); ok && info.Self {
			return m
		}
	}
	return nil
}

// PollUntil polls cond until it holds, failing the test after d.
func PollUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for !cond() {
		select {
		case <-poll.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
