package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// onHost is addr (host:port) at another loopback host.
func onHost(addr, host string) string {
	_, port, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(host, port)
}

// readyWithin waits up to d for s to answer /readyz with 200, and returns
// how long it took; it fails the test past d or when s exits.
func readyWithin(t *testing.T, s *server, start time.Time, d time.Duration) time.Duration {
	t.Helper()
	deadline := start.Add(d)
	for time.Now().Before(deadline) {
		resp, err := clusterHTTP.Get("http://" + s.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start)
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("%s exited before ready", s.nodeID)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s not ready within %v of its restart", s.nodeID, d)
	return 0
}

// TestClusterServerRenumbered: a server of a three-server cluster stops
// and starts again with the same data directory and id at another address
// (127.0.0.4, other ports), as on a DHCP or Kubernetes host. It rejoins as
// itself: the leader updates its Raft address, it becomes ready, a voter
// at the new address, with every lease, it starts no election (it never
// gets past a pre-vote) while writes went on, and every acknowledged lease
// is on every server. Stopped gracefully (SIGTERM) and killed (SIGKILL: gossip
// takes it as failed, not left).
func TestClusterServerRenumbered(t *testing.T) {
	t.Parallel()
	for name, sig := range map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a cluster of its own
			testServerRenumbered(t, sig)
		})
	}
}

func testServerRenumbered(t *testing.T, sig syscall.Signal) {
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	moved := c.others(leader)[0]
	const ttl = 10 * time.Minute
	before := acquire(t, leader, "renumber/before", "w", ttl)
	waitLeaseEverywhere(t, c.nodes, before, "active")
	st, err := leader.status()
	if err != nil {
		t.Fatal(err)
	}
	term := st.Term

	// Writes go on through the leader the whole time.
	stop := make(chan struct{})
	var load []*wire.Lease
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); load = loadUntil(leader, "renumber/load", ttl, 5000, stop) }()
	moved.cmd.Process.Signal(sig)
	<-moved.exited
	during := acquire(t, leader, "renumber/during", "w", ttl)
	moved.http, moved.raft, moved.gossip = onHost(freePort(t), "127.0.0.4"), onHost(freePort(t), "127.0.0.4"), onHost(freePort(t), "127.0.0.4")
	restart, logged := time.Now(), len(moved.log())
	moved.launch()
	took := readyWithin(t, moved, restart, 60*time.Second)
	t.Logf("%s, restarted at %s (raft %s), ready %v after its start", moved.nodeID, moved.http, moved.raft, took.Round(time.Millisecond))

	// The leader lists it as a healthy voter at its new Raft address.
	eventuallyMsg(t, 2*clusterTimeout, func() (bool, string) {
		st, err := leader.status()
		if err != nil {
			return false, err.Error()
		}
		for _, m := range st.Members {
			if m.ID == moved.nodeID {
				return m.Voter && m.RaftAddr == moved.raft && m.Health == "healthy", fmt.Sprintf("%+v", m)
			}
		}
		return false, fmt.Sprintf("%s missing from %+v", moved.nodeID, st.Members)
	})
	close(stop)
	wg.Wait()
	if len(load) < 10 {
		t.Fatalf("only %d leases acknowledged under load", len(load))
	}
	t.Logf("%d leases acknowledged while %s moved", len(load), moved.nodeID)
	waitLeaseEverywhere(t, c.nodes, before, "active")
	waitLeaseEverywhere(t, c.nodes, during, "active")
	// Nothing acknowledged is lost, on any server.
	for _, l := range load {
		waitLeaseEverywhere(t, c.nodes, l, "active")
	}
	after := acquire(t, leader, "renumber/after", "w", ttl)
	waitLeaseEverywhere(t, c.nodes, after, "active")
	if after.FencingToken <= during.FencingToken || during.FencingToken <= before.FencingToken {
		t.Fatalf("fencing tokens %d, %d, %d", before.FencingToken, during.FencingToken, after.FencingToken)
	}
	st, err = leader.status()
	if err != nil {
		t.Fatal(err)
	}
	// No election of the moved server's: it never got past a pre-vote
	// (which raises no term). Another election (the two others on a
	// loaded machine missing a heartbeat: Raft's 250 ms leader lease) says
	// nothing about the move; it is logged, not failed.
	if movedLog := moved.log()[logged:]; strings.Contains(movedLog, "pre-vote successful, starting election") ||
		strings.Contains(movedLog, "election won") {
		t.Fatalf("%s started an election after its move (the leader is %s at term %d, was leader at term %d)", moved.nodeID, st.State, st.Term, term)
	}
	if st.State != "Leader" || st.Term != term {
		t.Logf("the leader is %s at term %d, was leader at term %d: an election of the two others' (%s did not campaign)", st.State, st.Term, term, moved.nodeID)
	}
	c.waitFormed(c.nodes)
}
