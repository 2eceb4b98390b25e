package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
)

func newTestInproc(t *testing.T) *InprocCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	c, err := NewInprocCluster(ctx, InprocOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("cluster of %d formed in %v", c.Size(), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines of the cluster's servers:\n%s", c.h.Tail())
		}
		if err := c.Close(context.Background(), false); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

// poll calls cond until it returns true, failing the test after d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, d)
		case <-tick.C:
		}
	}
}

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// call sends one API request to addr and decodes the JSON answer.
func call(addr, method, path string, body any) (int, map[string]any, error) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, rd)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("decode: %w", err)
	}
	return resp.StatusCode, m, nil
}

var keySeq atomic.Int64

// acquire takes a fresh key through node i's front proxy; ok only on 201.
func acquire(c *InprocCluster, i int) (map[string]any, error) {
	key := fmt.Sprintf("k/%d", keySeq.Add(1))
	st, m, err := call(c.HTTPAddr(i), "POST", "/v1/leases", map[string]any{"key": key, "holder": "h", "ttl_ms": 60000})
	if err != nil {
		return nil, err
	}
	if st != http.StatusCreated {
		return nil, fmt.Errorf("acquire on %s: %d %v", c.NodeID(i), st, m)
	}
	return m, nil
}

// acquireSoon retries acquire on node i until it succeeds.
func acquireSoon(t *testing.T, c *InprocCluster, i int, d time.Duration) map[string]any {
	t.Helper()
	var l map[string]any
	var last error
	poll(t, d, fmt.Sprintf("a write through %s", c.NodeID(i)), func() bool {
		l, last = acquire(c, i)
		if last != nil {
			t.Logf("retrying: %v", last)
		}
		return last == nil
	})
	return l
}

// leader returns the index of the one ready leader among the running
// nodes named (all if none are), waiting for it.
func leader(t *testing.T, c *InprocCluster, among ...int) int {
	t.Helper()
	var exclude []string
	for i := range c.Size() {
		if len(among) > 0 && !slices.Contains(among, i) {
			exclude = append(exclude, c.NodeID(i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.h.WaitLeader(ctx, exclude...)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Index(c.ids, l.NodeID())
}

func others(c *InprocCluster, not int) []int {
	var out []int
	for i := range c.Size() {
		if i != not {
			out = append(out, i)
		}
	}
	return out
}

// readStale reads a lease on node i itself (no forwarding).
func readStale(c *InprocCluster, i int, id string) (int, map[string]any, error) {
	return call(c.HTTPAddr(i), "GET", "/v1/leases/"+id+"?stale=true", nil)
}

func TestInprocPartitionDeposesLeaderAndHealConverges(t *testing.T) {
	c := newTestInproc(t)
	old := leader(t, c)
	before := acquireSoon(t, c, old, 10*time.Second)

	maj := others(c, old)
	if err := c.Partition([][]int{{old}, maj}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	nl := leader(t, c, maj...)
	t.Logf("new leader %s after %v", c.NodeID(nl), time.Since(cut).Round(time.Millisecond))
	poll(t, 10*time.Second, "old leader deposed", func() bool {
		return !c.Node(old).Cluster().IsLeader()
	})
	// Writes through the majority's follower go through forwarding.
	var follower int
	for _, i := range maj {
		if i != nl {
			follower = i
		}
	}
	during := acquireSoon(t, c, follower, 10*time.Second)
	// The cut-off node cannot write.
	if l, err := acquire(c, old); err == nil {
		t.Fatalf("a write through the isolated old leader succeeded: %v", l)
	}
	// Its gossip gives the others up too (memberlist's own verdict, in
	// its log).
	poll(t, 10*time.Second, "gossip sees the partition", func() bool {
		b, err := os.ReadFile(c.LogPath(old))
		return err == nil && bytes.Contains(b, []byte("Marking n")) &&
			bytes.Contains(b, []byte("as failed"))
	})

	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	id := during["lease_id"].(string)
	poll(t, 15*time.Second, "the old leader catches up", func() bool {
		st, m, err := readStale(c, old, id)
		return err == nil && st == 200 && m["fencing_token"] == during["fencing_token"]
	})
	t.Logf("old leader caught up %v after heal", time.Since(healed).Round(time.Millisecond))
	st, m, err := call(c.HTTPAddr(old), "GET", "/v1/leases/"+before["lease_id"].(string), nil)
	if err != nil || st != 200 || m["state"] != "active" {
		t.Fatalf("lease from before the partition: %d %v %v", st, m, err)
	}
	acquireSoon(t, c, old, 10*time.Second)
}

func TestInprocOneWayBlock(t *testing.T) {
	c := newTestInproc(t)
	old := leader(t, c)
	// The leader can hear everyone but nobody hears it: its heartbeats are
	// lost, so the others elect a new leader among themselves.
	for _, j := range others(c, old) {
		if err := c.Block(old, j); err != nil {
			t.Fatal(err)
		}
	}
	nl := leader(t, c, others(c, old)...)
	poll(t, 10*time.Second, "old leader deposed", func() bool {
		return !c.Node(old).Cluster().IsLeader()
	})
	acquireSoon(t, c, nl, 10*time.Second)
	// Only that direction is cut: the old leader hears the new one (and
	// follows it), though its answers never arrive.
	poll(t, 10*time.Second, "the old leader hears the new one", func() bool {
		_, id := c.Node(old).Cluster().Leader()
		return string(id) == c.NodeID(nl)
	})
	// Forwarding obeys the block too: the old leader knows the new one but
	// cannot reach it, so a write through it is refused before it leaves.
	st, m, err := call(c.HTTPAddr(old), "POST", "/v1/leases", map[string]any{"key": "fwd", "holder": "h", "ttl_ms": 60000})
	if err != nil || st != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(m), "could not be reached") {
		t.Fatalf("write through a node blocked from the leader: %d %v %v", st, m, err)
	}
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	acquireSoon(t, c, old, 15*time.Second)
}

func TestInprocLossAndDelaySlowButDoNotBreakWrites(t *testing.T) {
	c := newTestInproc(t)
	l := leader(t, c)
	f := others(c, l)[0]
	base := time.Now()
	for range 5 {
		acquireSoon(t, c, f, 10*time.Second)
	}
	baseline := time.Since(base) / 5

	for i := range c.Size() {
		if err := c.Loss(i, 0.1); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delay(l, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const writes = 10
	for range writes {
		acquireSoon(t, c, f, 30*time.Second)
	}
	faulty := time.Since(start) / writes
	t.Logf("write through a follower: %v clean, %v with 10%% loss and 50ms leader delay", baseline, faulty)
	// Each forwarded write needs at least the leader's answer to the
	// follower and one replication round trip, both delayed.
	if faulty < 50*time.Millisecond {
		t.Fatalf("writes took %v each under a 50ms delay: the delay is not applied", faulty)
	}
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	acquireSoon(t, c, f, 10*time.Second)
	if err := c.Loss(0, 1.5); err == nil {
		t.Fatal("loss 1.5 accepted")
	}
}

func TestInprocIsolateClient(t *testing.T) {
	c := newTestInproc(t)
	l := leader(t, c)
	// Bad input is refused and changes nothing.
	for name, err := range map[string]error{
		"partition 7": c.Partition([][]int{{0, 7}}), "block self": c.Block(1, 1),
		"negative delay": c.Delay(0, -time.Second), "isolate -1": c.IsolateClient(-1),
	} {
		if err == nil {
			t.Fatalf("%s accepted", name)
		}
	}
	c.net.mu.Lock()
	blocked := len(c.net.blocked)
	c.net.mu.Unlock()
	if blocked != 0 {
		t.Fatalf("refused faults left %d blocks", blocked)
	}
	if err := c.IsolateClient(l); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", c.HTTPAddr(l), time.Second); err == nil {
		t.Fatal("an isolated node's front proxy accepted a connection")
	}
	// The node still leads: the others forward writes to it.
	acquireSoon(t, c, others(c, l)[0], 10*time.Second)
	if !c.Node(l).Cluster().IsLeader() {
		t.Fatal("client isolation cost the leader its leadership")
	}
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	acquireSoon(t, c, l, 10*time.Second)
}

func TestInprocKillRestartKeepsLeasesWipeEmpties(t *testing.T) {
	c := newTestInproc(t)
	old := leader(t, c)
	lease := acquireSoon(t, c, old, 10*time.Second)
	id := lease["lease_id"].(string)

	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	if c.Alive(old) {
		t.Fatal("killed node alive")
	}
	if _, err := net.DialTimeout("tcp", c.HTTPAddr(old), time.Second); err == nil {
		t.Fatal("a killed node's address accepted a connection")
	}
	nl := leader(t, c, others(c, old)...)
	st, m, err := call(c.HTTPAddr(nl), "GET", "/v1/leases/"+id, nil)
	if err != nil || st != 200 || m["state"] != "active" || m["fencing_token"] != lease["fencing_token"] {
		t.Fatalf("committed lease after failover: %d %v %v", st, m, err)
	}
	after := acquireSoon(t, c, nl, 10*time.Second)

	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	if !c.Alive(old) {
		t.Fatal("restarted node not alive")
	}
	poll(t, 15*time.Second, "restarted node has the lease written while it was down", func() bool {
		st, m, err := readStale(c, old, after["lease_id"].(string))
		return err == nil && st == 200 && m["state"] == "active"
	})
	st, m, err = readStale(c, old, id)
	if err != nil || st != 200 || m["fencing_token"] != lease["fencing_token"] {
		t.Fatalf("restarted node lost its lease: %d %v %v", st, m, err)
	}

	// Wipe a follower: its data directory goes.
	w := others(c, leader(t, c))[0]
	if err := c.Wipe(w); err != nil {
		t.Fatal(err)
	}
	if c.Alive(w) {
		t.Fatal("wiped node alive")
	}
	if _, err := os.Stat(c.DataDir(w)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("wiped data dir: %v", err)
	}
	// The two left still write.
	l := leader(t, c)
	last := acquireSoon(t, c, l, 10*time.Second)
	// Removed from the configuration, it comes back empty as a new server
	// under the same id, and catches up.
	if st, m, err := call(c.HTTPAddr(l), "DELETE", "/v1/cluster/members/"+c.NodeID(w), nil); err != nil || st != 200 {
		t.Fatalf("remove %s: %d %v %v", c.NodeID(w), st, m, err)
	}
	if err := c.Restart(w); err != nil {
		t.Fatalf("restart after wipe: %v", err)
	}
	poll(t, 20*time.Second, "the wiped node catches up as a new server", func() bool {
		st, m, err := readStale(c, w, last["lease_id"].(string))
		return err == nil && st == 200 && m["fencing_token"] == last["fencing_token"]
	})
	for _, f := range []func(int) error{c.Pause, c.Resume} {
		if err := f(0); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("pause/resume: %v", err)
		}
	}
}

// With DeadServerTimeout set, the leader removes a killed server once gossip
// has seen it failed that long (this needs gossip to report failed peers
// as failed).
func TestInprocDeadServerRemoved(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := NewInprocCluster(ctx, InprocOptions{Dir: t.TempDir(), Configure: func(_ int, cfg *node.Config) {
		cfg.DeadServerTimeout = time.Second
		cfg.MinQuorum = 2
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background(), false) })
	l := leader(t, c)
	f := others(c, l)[0]
	if err := c.Kill(f); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	poll(t, 20*time.Second, "the dead server removed", func() bool {
		conf, err := c.Node(l).Cluster().Configuration()
		if err != nil {
			return false
		}
		for _, s := range conf.Servers {
			if string(s.ID) == c.NodeID(f) {
				return false
			}
		}
		return true
	})
	t.Logf("killed server removed %v after the kill", time.Since(killed).Round(time.Millisecond))
	acquireSoon(t, c, l, 10*time.Second)
}
