package cluster

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testpki"
)

// openPeer opens a server over mutual TLS with a fixed cluster id.
func openPeer(t *testing.T, id, clusterID string, bootstrap bool, tc *TLSConfig) *Cluster {
	t.Helper()
	c, err := Open(Config{NodeID: id, Dir: t.TempDir(), BindAddr: "127.0.0.1:0", Bootstrap: bootstrap, TLS: tc,
		Identity: &Identity{ClusterID: func() string { return clusterID }}}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Node-to-node streams: a server of the cluster (the cluster CA, the same
// cluster id) reaches the handler served on the Raft port's peer listener;
// a server of another cluster id, or with a certificate of another CA, does
// not, and neither does a plain TCP client.
func TestPeerStreams(t *testing.T) {
	good, evil := testpki.NewCA(t, "cluster-ca"), testpki.NewCA(t, "other-ca")
	a := openPeer(t, "a", "cx", true, tlsFor(t, good, "a", good))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "peer ok "+r.URL.Path)
	})}
	go srv.Serve(a.PeerListener())
	t.Cleanup(func() { srv.Close() })

	get := func(from *Cluster) (string, error) {
		cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return from.DialPeer(ctx, addr) }}}
		defer cl.CloseIdleConnections()
		resp, err := cl.Get("http://" + string(a.Addr) + "/x")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	b := openPeer(t, "b", "cx", false, tlsFor(t, good, "b", good))
	if got, err := get(b); err != nil || got != "peer ok /x" {
		t.Fatalf("a server of the cluster: %q, %v", got, err)
	}
	other := openPeer(t, "c", "cy", false, tlsFor(t, good, "c", good))
	if got, err := get(other); err == nil || !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("a server of another cluster id: %q, %v", got, err)
	}
	stranger := openPeer(t, "d", "cx", false, tlsFor(t, evil, "d", evil))
	if got, err := get(stranger); err == nil {
		t.Fatalf("a server of another CA: %q", got)
	}
	// A client without the cluster's certificate, speaking the peer hello
	// in plaintext: the TLS layer drops it.
	conn, err := net.DialTimeout("tcp", string(a.Addr), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(append(peerMagic[:], 2, 'c', 'x'))
	conn.Write([]byte("GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(conn)
	if strings.Contains(string(got), "peer ok") {
		t.Fatalf("a plaintext client reached the peer handler: %q", got)
	}
}

// Without TLS, the Raft port's cluster id exchange still applies: another
// cluster's server is refused; in-memory clusters have no peer streams.
func TestPeerStreamsPlainAndInMemory(t *testing.T) {
	a := openPeer(t, "a", "cx", true, nil)
	go http.Serve(a.PeerListener(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	other := openPeer(t, "c", "cy", false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := other.DialPeer(ctx, string(a.Addr)); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("another cluster's server: %v", err)
	}
	same := openPeer(t, "b", "cx", false, nil)
	c, err := same.DialPeer(ctx, string(a.Addr))
	if err != nil {
		t.Fatalf("a server of the cluster: %v", err)
	}
	c.Close()
	// A caller that does not know its cluster id (a new server, or a
	// client speaking the hello with an empty id) gets no stream.
	anon := openPeer(t, "e", "", false, nil)
	if c, err := anon.DialPeer(ctx, string(a.Addr)); err == nil {
		c.Close()
		t.Fatal("a server without a cluster id opened a node-to-node stream")
	}
	raw, err := net.DialTimeout("tcp", string(a.Addr), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write(append(peerMagic[:], 0))
	raw.Write([]byte("GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, _ := io.ReadAll(raw); strings.Contains(string(got), "ok") {
		t.Fatalf("a caller with an empty cluster id reached the peer handler: %q", got)
	}
	mem, err := Open(Config{NodeID: "m", InMemory: true, Bootstrap: true}, &countFSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if mem.PeerListener() != nil {
		t.Fatal("an in-memory cluster has a peer listener")
	}
	if _, err := mem.DialPeer(ctx, string(a.Addr)); err == nil {
		t.Fatal("an in-memory cluster dialled a peer stream")
	}
}
