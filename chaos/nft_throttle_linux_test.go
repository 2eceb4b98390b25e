package chaos

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRenderThrottle: a throttled link is redirected through the pair's
// proxy on both ends (the sender's connections, and the answers on the
// receiver's), other nodes are left alone, and Heal removes it.
func TestRenderThrottle(t *testing.T) {
	a := nftAddrs{nodes: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, harness: "10.0.0.254", proxy: "10.0.0.253",
		raftPort: 7701, gossipPort: 7702, httpPort: 7700, proxyFor: proxyPort}
	f := newFaultState(3)
	f.rate[0][2] = 1000
	g := newFaultState(3)
	copyFaults(&g, &f)
	if g.rate[0][2] != 1000 {
		t.Fatalf("copyFaults lost the rate: %v", g.rate)
	}
	want := func(i, to int) string {
		return fmt.Sprintf("ip daddr %s tcp dport 7701 dnat ip to 10.0.0.253:%d", a.nodes[to], proxyPort(i, to))
	}
	if s := g.render("t", 0, a); !strings.Contains(s, want(0, 2)) {
		t.Errorf("node 0 not redirected to the proxy of (0, 2):\n%s", s)
	}
	if s := g.render("t", 2, a); !strings.Contains(s, want(2, 0)) {
		t.Errorf("node 2 not redirected to the proxy of (2, 0):\n%s", s)
	}
	if s := g.render("t", 1, a); strings.Contains(s, "dnat") {
		t.Errorf("node 1 redirected:\n%s", s)
	}
	g.heal()
	if s := g.render("t", 0, a); strings.Contains(s, "dnat") || g.proxied(0, 2) {
		t.Errorf("healed, still redirected:\n%s", s)
	}
}

// TestPumpRate: under a rate cap the proxy's pump moves no more than the
// rate allows (a lower bound on the time: a slow machine only adds to it).
func TestPumpRate(t *testing.T) {
	src, in := net.Pipe()
	out, dst := net.Pipe()
	var delay, rate atomic.Int64
	rate.Store(40 << 10) // 40 KiB/s
	closed := make(chan struct{})
	stop := func() {
		select {
		case <-closed:
		default:
			close(closed)
		}
		in.Close()
		out.Close()
	}
	go pump(out, in, &delay, &rate, closed, stop)
	payload := make([]byte, 20<<10) // half a second's worth
	go func() { src.Write(payload); src.Close() }()
	start := time.Now()
	got, err := io.ReadAll(dst)
	took := time.Since(start)
	if err != nil || len(got) != len(payload) {
		t.Fatalf("read %d bytes (%v), want %d", len(got), err, len(payload))
	}
	// The first read goes through at once; the rest waits its share.
	if took < 400*time.Millisecond {
		t.Fatalf("20 KiB at 40 KiB/s took %v, want >= 400ms", took)
	}
}
