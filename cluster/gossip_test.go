package cluster

import (
	"net"
	"testing"
	"time"
)

func startTestGossip(t *testing.T, name string, key []byte) *Gossip {
	t.Helper()
	return startGossipMeta(t, name, key, Meta{ID: name})
}

// startGossipMeta starts gossip for server name that announces meta.
func startGossipMeta(t *testing.T, name string, key []byte, meta Meta) *Gossip {
	t.Helper()
	// memberlist binds UDP and TCP on the same port: find one free for both.
	var g *Gossip
	var err error
	for range 20 {
		l, lerr := net.Listen("tcp", "127.0.0.1:0")
		if lerr != nil {
			t.Fatal(lerr)
		}
		addr := l.Addr().String()
		l.Close()
		g, err = StartGossip(GossipConfig{Name: name, BindAddr: addr, Key: key, Fast: true,
			Meta: func() Meta { return meta }})
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// Servers sharing the gossip key see each other; a server with another key
// or none cannot join, and the keyed servers never list it.
func TestGossipKey(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	a := startTestGossip(t, "a", key)
	b := startTestGossip(t, "b", key)
	if n, err := b.Join([]string{a.Addr()}); err != nil || n != 1 {
		t.Fatalf("join with the same key: %d %v", n, err)
	}
	waitFor(t, 10*time.Second, "a and b see each other", func() bool { return a.Alive() == 2 && b.Alive() == 2 })

	wrong := startTestGossip(t, "wrong", []byte("fedcba9876543210fedcba9876543210"))
	if n, err := wrong.Join([]string{a.Addr(), b.Addr()}); err == nil || n != 0 {
		t.Fatalf("join with another key: %d contacted, err %v", n, err)
	}
	none := startTestGossip(t, "none", nil)
	if n, err := none.Join([]string{a.Addr(), b.Addr()}); err == nil || n != 0 {
		t.Fatalf("join without a key: %d contacted, err %v", n, err)
	}
	// Nor can a keyed server pull them in.
	if n, err := a.Join([]string{wrong.Addr(), none.Addr()}); err == nil || n != 0 {
		t.Fatalf("keyed server joined strangers: %d %v", n, err)
	}
	// b's next push/pull with a (2 s in Fast mode) must still show two.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, g := range []*Gossip{a, b} {
			for _, p := range g.Peers() {
				if p.ID == "wrong" || p.ID == "none" {
					t.Fatalf("%s lists %s", g.cfg.Name, p.ID)
				}
			}
			// Never more than the two keyed servers. (Fewer for a moment
			// is a probe missed on a loaded machine, not a stranger.)
			if g.Alive() > 2 {
				t.Fatalf("%s sees %d members", g.cfg.Name, g.Alive())
			}
		}
		if wrong.Alive() != 1 || none.Alive() != 1 {
			t.Fatalf("strangers see %d and %d members", wrong.Alive(), none.Alive())
		}
		<-time.After(50 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "a and b still see each other", func() bool { return a.Alive() == 2 && b.Alive() == 2 })
}
