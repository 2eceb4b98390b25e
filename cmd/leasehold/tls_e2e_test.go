package main

// Process-level transport security: three servers with HTTPS (client
// certificates required), Raft over mutual TLS and encrypted gossip form a
// cluster, forward over TLS and replicate; the CLI talks to them with
// --tls-* flags and LEASEHOLD_CLIENT_*; a server with another gossip key
// cannot join, and one whose Raft certificate comes from another CA is
// never caught up nor made a voter.

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/testpki"
	"github.com/leasehold/leasehold/wire"
)

// tlsClient is an API client for s over TLS with the given files.
func tlsClient(t *testing.T, addrs []string, f testpki.Files, stale bool) *client.Client {
	t.Helper()
	cf := clientTLSFlags{ca: f.CA, cert: f.Cert, key: f.Key}
	tc, err := cf.config()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(addrs, client.Options{TLSConfig: tc, Timeout: 5 * time.Second, StaleReads: stale})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitStatus polls s's own cluster view until cond accepts it.
func waitStatus(t *testing.T, s *server, c *client.Client, what string, cond func(*wire.ClusterStatus) bool) *wire.ClusterStatus {
	t.Helper()
	var last string
	deadline := time.Now().Add(clusterTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Cluster(ctx)
		cancel()
		if err == nil && cond(st) {
			return st
		}
		if b, _ := json.Marshal(st); err == nil {
			last = string(b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not within %v; last: %s\nlog:\n%s", s.nodeID, what, clusterTimeout, last, tail(s.log(), 16<<10))
		}
		select {
		case <-s.exited:
			t.Fatalf("%s exited; log:\n%s", s.nodeID, tail(s.log(), 16<<10))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func voters(st *wire.ClusterStatus) int {
	n := 0
	for _, m := range st.Members {
		if m.Voter {
			n++
		}
	}
	return n
}

// runCLI runs the leasehold binary with args and extra environment and
// returns its stdout.
func runCLI(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(buildBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%v: %s", err, stderr.String())
	}
	return string(out), nil
}

func TestProcessTLSCluster(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, evil := testpki.NewCA(t, "cluster-ca"), testpki.NewCA(t, "evil-ca")
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))), 0o600); err != nil {
		t.Fatal(err)
	}
	clientFiles := ca.WriteFiles(dir, "client", ca.Issue("test-client"))

	var nodes []*server
	var gossip []string
	for i := range 3 {
		s := newServer(t)
		s.nodeID = fmt.Sprintf("n%d", i+1)
		s.tickPeriod = clusterTick.String()
		nodes = append(nodes, s)
		gossip = append(gossip, s.gossip)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range nodes {
				t.Logf("---- log of %s ----\n%s", s.nodeID, tail(s.log(), 32<<10))
			}
		}
	})
	// Every server: one certificate for HTTP and (reused) for Raft, client
	// certificates required, the same gossip key.
	secure := func(s *server, certCA *testpki.CA, raftCA *testpki.CA, key string) []string {
		f := certCA.WriteFiles(dir, s.nodeID, certCA.Issue(s.nodeID))
		args := []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-client-ca", f.CA, "--tls-ca", f.CA,
			"--gossip-key-file", key}
		if raftCA == certCA {
			return append(args, "--raft-tls-ca", f.CA)
		}
		rf := raftCA.WriteFiles(dir, s.nodeID+"-raft", raftCA.Issue(s.nodeID))
		return append(args, "--raft-tls-ca", rf.CA, "--raft-tls-cert", rf.Cert, "--raft-tls-key", rf.Key)
	}
	for _, s := range nodes {
		s.extra = append(secure(s, ca, ca, keyFile), "--join", strings.Join(gossip, ","), "--bootstrap-expect", "3")
		s.launch()
	}
	var clients []*client.Client
	var leaderIdx int
	for i, s := range nodes {
		c := tlsClient(t, []string{s.http}, clientFiles, true)
		clients = append(clients, c)
		st := waitStatus(t, s, c, "three voters and a leader", func(st *wire.ClusterStatus) bool {
			return st.Leader != "" && voters(st) == 3
		})
		if st.State == "Leader" {
			leaderIdx = i
		}
	}
	leader := nodes[leaderIdx]
	follower := nodes[(leaderIdx+1)%3]
	st := waitStatus(t, leader, clients[leaderIdx], "the leader sees itself", func(st *wire.ClusterStatus) bool {
		return st.State == "Leader" && voters(st) == 3
	})
	for _, m := range st.Members {
		if !strings.Contains(m.HTTPAddr, ":") {
			t.Fatalf("member %+v has no HTTP address", m)
		}
	}

	// Plain HTTP, and TLS without a client certificate, get nothing.
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + follower.http + "/v1/cluster"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS port: %d", resp.StatusCode)
		}
	}
	noCert := tlsClient(t, []string{follower.http}, testpki.Files{CA: clientFiles.CA}, true)
	if _, err := noCert.Cluster(context.Background()); err == nil {
		t.Fatal("a client without a certificate got an answer")
	}

	// The CLI through a follower, TLS settings from the environment:
	// forwarded to the leader over TLS.
	env := []string{"LEASEHOLD_CLIENT_CA=" + clientFiles.CA, "LEASEHOLD_CLIENT_CERT=" + clientFiles.Cert, "LEASEHOLD_CLIENT_KEY=" + clientFiles.Key}
	out, err := runCLI(t, env, "acquire", "--addr", follower.http, "--holder", "tls-worker", "--ttl", "30s", "--json", "camera/tls")
	if err != nil {
		t.Fatalf("acquire through the follower: %v\nfollower log:\n%s", err, tail(follower.log(), 16<<10))
	}
	var l wire.Lease
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.FencingToken == 0 || l.Token == "" {
		t.Fatalf("acquire output %q: %v", out, err)
	}
	// A control socket on the follower: its acquire reaches the leader over
	// the Raft port's node-to-node stream (mutual TLS), and the HTTP API
	// does not serve that route to a client, even one with a certificate.
	{
		cf := clientTLSFlags{ca: clientFiles.CA, cert: clientFiles.Cert, key: clientFiles.Key}
		tc, err := cf.config()
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		defer hc.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "wss://"+follower.http+"/v1/control/ws", &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatalf("control socket on the follower: %v", err)
		}
		defer ws.CloseNow()
		if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"control.acquire","requestId":"r1","clientName":"tls"}`)); err != nil {
			t.Fatal(err)
		}
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("control acquire through the follower: %v\nfollower log:\n%s", err, tail(follower.log(), 16<<10))
			}
			var m struct {
				Type, RequestID string
			}
			if json.Unmarshal(b, &m) == nil && m.RequestID == "r1" {
				if m.Type != "control.acquired" {
					t.Fatalf("control acquire through the follower: %s", b)
				}
				break
			}
		}
		resp, err := hc.Post("https://"+leader.http+"/v1/control/forward", "application/json",
			strings.NewReader(`{"op":"acquire","acquire":{"holder":"mallory","ttlMs":5000}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("the node-to-node route on the leader's HTTP API: %d", resp.StatusCode)
		}
		ws.Close(websocket.StatusNormalClosure, "")
	}
	// ... and with flags and an https:// URL, on the leader.
	out, err = runCLI(t, nil, "get", "--addr", "https://"+leader.http, "--tls-ca", clientFiles.CA,
		"--tls-cert", clientFiles.Cert, "--tls-key", clientFiles.Key, "--json", l.LeaseID)
	if err != nil || !strings.Contains(out, `"tls-worker"`) {
		t.Fatalf("get on the leader: %q %v", out, err)
	}
	// hold and bench (its own HTTP/1.1 connections) over TLS too.
	if out, err := runCLI(t, env, "hold", "--addr", follower.http, "--ttl", "5s", "camera/hold", "--", "true"); err != nil {
		t.Fatalf("hold over TLS: %q %v", out, err)
	}
	out, err = runCLI(t, env, "bench", "--addr", leader.http, "--workload", "cycle", "--clients", "2",
		"--duration", "500ms", "--json")
	var bench []struct {
		Ops    int64            `json:"ops"`
		Codes  map[string]int64 `json:"error_codes"`
		Errors int64            `json:"errors"`
	}
	if err != nil || json.Unmarshal([]byte(out), &bench) != nil || len(bench) != 1 || bench[0].Ops == 0 {
		t.Fatalf("bench over TLS: %q %v", out, err)
	}
	// A leader change under load may cost some cycles; anything else
	// (a transport or TLS failure) is a failure.
	for code := range bench[0].Codes {
		if code != "NO_LEADER" && code != "INDETERMINATE" && code != "UNAVAILABLE" {
			t.Fatalf("bench over TLS: error %s: %q", code, out)
		}
	}
	// Without the client certificate the CLI is refused, even with the
	// server's LEASEHOLD_TLS_* in its environment (as in a server's
	// container): a client command does not read those once a
	// LEASEHOLD_CLIENT_* is set.
	serverFiles := ca.WriteFiles(dir, "srv-env", ca.Issue("127.0.0.1"))
	serverEnv := []string{"LEASEHOLD_TLS_CA=" + serverFiles.CA, "LEASEHOLD_TLS_CERT=" + serverFiles.Cert, "LEASEHOLD_TLS_KEY=" + serverFiles.Key}
	if _, err := runCLI(t, append(serverEnv, "LEASEHOLD_CLIENT_CA="+clientFiles.CA), "get", "--addr", leader.http, l.LeaseID); err == nil {
		t.Fatal("the CLI without a client certificate got an answer")
	}
	// The old names alone still work for a client, with a warning.
	{
		cmd := exec.Command(buildBinary(t), "get", "--addr", leader.http, l.LeaseID)
		cmd.Env = append(os.Environ(), "LEASEHOLD_TLS_CA="+clientFiles.CA, "LEASEHOLD_TLS_CERT="+clientFiles.Cert, "LEASEHOLD_TLS_KEY="+clientFiles.Key,
			"LEASEHOLD_CLIENT_CA=", "LEASEHOLD_CLIENT_CERT=", "LEASEHOLD_CLIENT_KEY=")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), l.LeaseID) {
			t.Fatalf("get with LEASEHOLD_TLS_*: %v %q\n%s", err, out, stderr.String())
		}
		if !strings.Contains(stderr.String(), "LEASEHOLD_TLS_CERT is deprecated") {
			t.Errorf("get with LEASEHOLD_TLS_*: no deprecation warning on stderr: %q", stderr.String())
		}
	}
	// Replicated over Raft mTLS: every server has it in its own state.
	for i, s := range nodes {
		eventuallyMsg(t, clusterTimeout, func() (bool, string) {
			got, err := clients[i].Get(context.Background(), l.LeaseID)
			if err != nil {
				return false, err.Error()
			}
			return got.FencingToken == l.FencingToken && got.State == "active", fmt.Sprintf("%s: %+v", s.nodeID, got)
		})
	}

	// A server with another gossip key (right certificates) cannot join:
	// it gives up after --join-timeout and the cluster never lists it.
	otherKey := filepath.Join(dir, "other.key")
	os.WriteFile(otherKey, []byte(base64.StdEncoding.EncodeToString([]byte("fedcba9876543210"))), 0o600)
	stranger := newServer(t)
	stranger.nodeID = "stranger"
	stranger.tickPeriod = clusterTick.String()
	stranger.extra = append(secure(stranger, ca, ca, otherKey), "--join", strings.Join(gossip, ","), "--join-timeout", "3s")
	stranger.launch()
	select {
	case <-stranger.exited:
	case <-time.After(clusterTimeout):
		t.Fatalf("a server with another gossip key kept running; log:\n%s", tail(stranger.log(), 16<<10))
	}
	if code := stranger.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(stranger.log(), "could not join any of") {
		t.Fatalf("stranger exited %d; log:\n%s", code, tail(stranger.log(), 16<<10))
	}

	// A server with the gossip key but a Raft certificate from another CA:
	// gossip admits it, the leader adds it as a non-voter, and every Raft
	// connection between them is refused, so it never catches up.
	intruder := newServer(t)
	intruder.nodeID = "intruder"
	intruder.tickPeriod = clusterTick.String()
	intruder.extra = append(secure(intruder, ca, evil, keyFile), "--join", strings.Join(gossip, ","))
	intruder.launch()
	ic := tlsClient(t, []string{intruder.http}, clientFiles, true)
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		return strings.Contains(intruder.log(), "raft TLS: refused a connection"), "no refused Raft connection logged by the intruder"
	})
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		return strings.Contains(leader.log(), "raft TLS handshake with "+intruder.raft), "the leader logged no failed handshake with the intruder"
	})
	// The cluster keeps working and keeps three voters.
	c := tlsClient(t, []string{follower.http}, clientFiles, false)
	if _, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "camera/after", Holder: "h", TTLMS: 10000}); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, leader, clients[leaderIdx], "three voters", func(st *wire.ClusterStatus) bool { return voters(st) == 3 })
	for _, m := range st.Members {
		if m.ID == "intruder" && (m.Voter || m.Health == "healthy") {
			t.Fatalf("intruder admitted: %+v", m)
		}
	}
	ist, err := ic.Cluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ist.AppliedIndex != 0 || ist.State == "Leader" {
		t.Fatalf("the intruder applied %d entries (state %s)", ist.AppliedIndex, ist.State)
	}
	// SIGHUP re-reads the certificate: replace the follower's files,
	// keeping their modification times (so only the signal can tell), and
	// wait for handshakes to show the new one.
	certPath, keyPath := filepath.Join(dir, follower.nodeID+".pem"), filepath.Join(dir, follower.nodeID+"-key.pem")
	st0, err := os.Stat(certPath)
	if err != nil {
		t.Fatal(err)
	}
	ca.WriteFiles(dir, follower.nodeID, ca.Issue(follower.nodeID+"-renewed"))
	for _, p := range []string{certPath, keyPath} {
		os.Chtimes(p, st0.ModTime(), st0.ModTime())
	}
	served := func() string {
		tc, err := (&clientTLSFlags{ca: clientFiles.CA, cert: clientFiles.Cert, key: clientFiles.Key}).config()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", follower.http, tc)
		if err != nil {
			return err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != follower.nodeID {
		t.Fatalf("before SIGHUP the follower serves %q", got)
	}
	follower.cmd.Process.Signal(syscall.SIGHUP)
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		got := served()
		return got == follower.nodeID+"-renewed", "serving " + got
	})
	select {
	case <-follower.exited:
		t.Fatal("SIGHUP stopped the server")
	default:
	}

	gossipKey, _ := os.ReadFile(keyFile)
	for _, s := range append(nodes, intruder, stranger) {
		if lg := s.log(); strings.Contains(lg, "PRIVATE KEY") || strings.Contains(lg, string(gossipKey)) {
			t.Fatalf("%s logged key material", s.nodeID)
		}
	}
}
