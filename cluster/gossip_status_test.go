package cluster

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport counts the packets a gossip server sends.
type countingTransport struct {
	memberlist.NodeAwareTransport
	sent *atomic.Int64
}

func (t countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.sent.Add(1)
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

func startWrappedGossip(t *testing.T, name string, wrap func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport) *Gossip {
	t.Helper()
	g, err := StartGossip(GossipConfig{Name: name, BindAddr: "127.0.0.1:0", Fast: true,
		Meta: func() Meta { return Meta{ID: name} }, WrapTransport: wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func waitStatus(t *testing.T, g *Gossip, id, status string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if p, ok := g.Peer(id); ok && p.Status == status {
			return
		}
		if time.Now().After(deadline) {
			p, _ := g.Peer(id)
			t.Fatalf("%s never %s as seen by %s (last %q)", id, status, g.cfg.Name, p.Status)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// A server that stops answering is reported failed (memberlist's Node.State
// is never set, so the status must come from the callback), and the
// transport hook carries gossip.
func TestGossipReportsFailedPeerThroughWrappedTransport(t *testing.T) {
	var sent atomic.Int64
	a := startWrappedGossip(t, "a", func(nt memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		return countingTransport{NodeAwareTransport: nt, sent: &sent}
	})
	// b is shut down abruptly below (Close would then panic in Leave).
	b, err := StartGossip(GossipConfig{Name: "b", BindAddr: "127.0.0.1:0", Fast: true,
		Meta: func() Meta { return Meta{ID: "b"} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.ml.Shutdown() })
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "b", "alive")
	waitStatus(t, b, "a", "alive")
	// Abruptly: no leave message.
	if err := b.ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "b", "failed")
	if sent.Load() == 0 {
		t.Fatal("no packet went through the wrapped transport")
	}
}
