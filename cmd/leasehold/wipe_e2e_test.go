package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readyz returns n's /readyz status code and body.
func readyz(s *server) (int, string) {
	code, _, body, err := call("GET", "http://"+s.http+"/readyz", nil, nil, nil)
	if err != nil {
		return 0, err.Error()
	}
	return code, string(body)
}

// A wiped first server restarted with its original command (no --join)
// while the others are stopped bootstraps a cluster of its own. When the
// others return, the two clusters never exchange Raft traffic: the original
// cluster takes nothing from it and removes the old member, and the wiped
// server stays unready saying what to do. Done as told (wipe, --join), it
// joins as a new server with the original state.
func TestClusterWipedFirstServerOriginalCommand(t *testing.T) {
	t.Parallel()
	n1 := newServer(t)
	n1.nodeID, n1.tickPeriod = "n1", clusterTick.String()
	n2, n3 := newServer(t), newServer(t)
	n2.nodeID, n3.nodeID = "n2", "n3"
	for _, s := range []*server{n2, n3} {
		s.tickPeriod = clusterTick.String()
		s.extra = []string{"--join", n1.gossip}
	}
	c := &testCluster{t: t, nodes: []*server{n1, n2, n3}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range c.nodes {
				t.Logf("---- log of %s (http %s) ----\n%s", s.nodeID, s.http, tail(s.log(), 64<<10))
			}
		}
	})
	n1.start()
	n2.launch()
	n3.launch()
	c.waitAllReady()
	c.waitFormed(c.nodes)
	orig := acquire(t, n2, "wipe/original", "w", time.Minute)
	waitLeaseEverywhere(t, c.nodes, orig, "active")

	// kill -9 n1, wipe it, stop the others, restart n1 as it was started.
	n1.kill()
	if err := os.RemoveAll(n1.dataDir); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*server{n2, n3} {
		if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			for _, s := range []*server{n2, n3} {
				s.cmd.Process.Signal(syscall.SIGCONT)
			}
		}
	}
	t.Cleanup(resume)
	n1.start() // a one-server cluster of its own
	if !strings.Contains(n1.log(), "bootstrapped a new cluster") {
		t.Fatal("the wiped server did not bootstrap")
	}
	// It takes a write in its own cluster.
	stray := acquire(t, n1, "wipe/stray", "w", time.Minute)
	resume()
	resumedAt := time.Now()

	// The wiped server goes unready and says what to do.
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		code, body := readyz(n1)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "--join"), fmt.Sprintf("n1 /readyz %d %s", code, body)
	})
	t.Logf("n1 refused %v after the others resumed", time.Since(resumedAt).Round(time.Millisecond))
	// It writes and reads nothing any more, even as its own cluster's leader.
	if code, _, body, _ := call("POST", "http://"+n1.http+"/v1/leases", map[string]any{"key": "wipe/late", "holder": "w", "ttl_ms": 60000}, nil, nil); code != http.StatusServiceUnavailable {
		t.Fatalf("acquire on the refused server: %d %s", code, body)
	}
	if _, code, err := getLease(n1, stray.LeaseID, false); code != http.StatusServiceUnavailable {
		t.Fatalf("linearizable read on the refused server: %d %v", code, err)
	}
	// The original cluster removed the old member, kept its state, and
	// took nothing from n1.
	up := []*server{n2, n3}
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		for _, s := range up {
			st, err := s.status()
			if err != nil {
				return false, err.Error()
			}
			for _, m := range st.Members {
				if m.ID == "n1" && m.Voter {
					return false, fmt.Sprintf("%s: n1 is still a voter: %+v", s.nodeID, st.Members)
				}
			}
			if st.Leader == "" || st.Leader == "n1" {
				return false, fmt.Sprintf("%s: leader %q", s.nodeID, st.Leader)
			}
		}
		return true, ""
	})
	for _, s := range up {
		if got, code, err := getLease(s, stray.LeaseID, false); code != http.StatusNotFound && (err != nil || got.Key == stray.Key) {
			t.Fatalf("%s: the wiped server's lease %s reached the original cluster: %d %+v %v", s.nodeID, stray.LeaseID, code, got, err)
		}
		if got, _, err := getLease(s, orig.LeaseID, false); err != nil || got.State != "active" || got.FencingToken != orig.FencingToken {
			t.Fatalf("%s: original lease %+v %v", s.nodeID, got, err)
		}
	}
	if logs := n2.log() + n3.log(); !strings.Contains(logs, "raft peer refused the connection") {
		t.Fatal("n2 and n3 do not log that n1 refuses them")
	}
	if _, code, _ := getLease(n1, orig.LeaseID, true); code != http.StatusNotFound && code != http.StatusServiceUnavailable {
		t.Fatalf("n1 reads the original cluster's lease: %d", code)
	}

	// The operator does what n1 says: wipe it, start it with --join.
	n1.kill()
	if err := os.RemoveAll(n1.dataDir); err != nil {
		t.Fatal(err)
	}
	n1.extra = []string{"--join", n2.gossip}
	n1.launch()
	c.waitAllReady()
	c.waitFormed(c.nodes)
	waitLeaseEverywhere(t, c.nodes, orig, "active")
	c.waitSameApplied(c.nodes)
}
