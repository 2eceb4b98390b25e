// Package testcluster starts real Leasehold clusters in the test process:
// three nodes on loopback with the HTTP API in front of each, for tests
// outside package api (api's own tests cannot import this package: it
// imports api).
package testcluster

import (
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
)

// Member is one node of the cluster with the API in front of it.
type Member struct {
	ID   string
	Node *node.Node
	// Addr is the API's base URL.
	Addr string
	srv  *http.Server
	once sync.Once
}

// Stop closes the member's API and node (a crash, as far as the other
// members can tell); calling it again is harmless.
func (m *Member) Stop() {
	m.once.Do(func() {
		m.srv.Close()
		m.Node.Close()
	})
}

// freeAddr picks a loopback port free for both TCP and UDP (gossip uses
// both), below the kernel's ephemeral range.
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 2000 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatal("no free loopback port for TCP and UDP")
	return ""
}

// Start forms a three-node cluster (bootstrap-expect 3) and waits, up to
// 60 s, for every node to know a leader. The members stop at the end of
// the test. Skipped with -short.
func Start(t testing.TB) []*Member {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	ids := []string{"c1", "c2", "c3"}
	gossip := make([]string, len(ids))
	for i := range ids {
		gossip[i] = freeAddr(t)
	}
	ms := make([]*Member, len(ids))
	for i, id := range ids {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.NodeID, cfg.DataDir = id, t.TempDir()
		cfg.RaftAddr, cfg.GossipAddr, cfg.HTTPAddr = freeAddr(t), gossip[i], ln.Addr().String()
		cfg.BootstrapExpect, cfg.Join = 3, gossip
		cfg.TickPeriod = 50 * time.Millisecond
		// Raft's default 500 ms lets a saturated machine depose leaders
		// at random.
		cfg.RaftTimeout = time.Second
		n, err := node.Open(cfg)
		if err != nil {
			ln.Close()
			t.Fatalf("open %s: %v", id, err)
		}
		m := &Member{ID: id, Node: n, Addr: "http://" + ln.Addr().String(),
			srv: &http.Server{Handler: api.New(api.FromNode(n), api.Options{}), ReadHeaderTimeout: 10 * time.Second}}
		go m.srv.Serve(ln)
		ms[i] = m
		t.Cleanup(m.Stop)
	}
	PollUntil(t, 60*time.Second, "a leader known to every node", func() bool {
		for _, m := range ms {
			if m.Node.ReadyErr() != nil {
				return false
			}
			if _, ok := m.Node.Leader(); !ok {
				return false
			}
		}
		return true
	})
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
