package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pausedOp is one request sent to a server while the leader was stopped.
type pausedOp struct {
	node   string
	write  bool
	start  time.Time
	took   time.Duration
	status int
	err    error
}

// TestClusterPausedLeaderBoundsForwards SIGSTOPs the leader (it keeps its
// sockets: connections open and requests are taken by the kernel, nothing
// answers) while clients keep sending acquires and reads to the two other
// servers. No request may wait on the stopped leader longer than the
// forward bound, and once another server leads, a write through the
// remaining follower succeeds.
func TestClusterPausedLeaderBoundsForwards(t *testing.T) {
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	survivors := c.others(leader)
	// Warm up: the followers' forwarding connections to the leader exist
	// (a stopped leader's are the ones that hang).
	for i, s := range survivors {
		acquire(t, s, fmt.Sprintf("pause/warm/%d", i), "w", 30*time.Second)
	}

	if err := leader.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	t.Cleanup(func() { leader.cmd.Process.Signal(syscall.SIGCONT) })

	// A client that waits far longer than any bound: a hung forward shows
	// as a long request, not as this client's timeout.
	cl := &http.Client{Timeout: 30 * time.Second}
	var mu sync.Mutex
	var ops []pausedOp
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range survivors {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					op := pausedOp{node: s.nodeID, write: (i+w)%2 == 0, start: time.Now()}
					var req *http.Request
					if op.write {
						body := fmt.Sprintf(`{"key":"pause/%s/%d/%d","holder":"w","ttl_ms":30000}`, s.nodeID, w, i)
						req, _ = http.NewRequest("POST", "http://"+s.http+"/v1/leases", strings.NewReader(body))
					} else {
						req, _ = http.NewRequest("GET", "http://"+s.http+"/v1/leases?prefix=pause/warm/", nil)
					}
					resp, err := cl.Do(req)
					if err == nil {
						op.status = resp.StatusCode
						var sink json.RawMessage
						_ = json.NewDecoder(resp.Body).Decode(&sink)
						resp.Body.Close()
					}
					op.took, op.err = time.Since(op.start), err
					mu.Lock()
					ops = append(ops, op)
					mu.Unlock()
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
		}
	}

	// The election, as the survivors report it.
	newLeader, took := c.waitNewLeader(survivors, stoppedAt)
	electedAt := stoppedAt.Add(took)
	follower := c.others(leader, newLeader)[0]
	t.Logf("%s stopped; %s leads %v later", leader.nodeID, newLeader.nodeID, took.Round(time.Millisecond))

	// Wait for a write through the remaining follower that was sent after
	// the election and succeeded, then for every request in flight.
	var firstWrite time.Time
	deadline := electedAt.Add(20 * time.Second)
	for firstWrite.IsZero() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		for _, op := range ops {
			end := op.start.Add(op.took)
			if op.node == follower.nodeID && op.write && op.status == http.StatusCreated && end.After(electedAt) &&
				(firstWrite.IsZero() || end.Before(firstWrite)) {
				firstWrite = end
			}
		}
		mu.Unlock()
	}
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(40 * time.Second):
		t.Fatal("requests to the followers still in flight 40 s after the end of the test")
	}

	mu.Lock()
	defer mu.Unlock()
	sort.Slice(ops, func(i, j int) bool { return ops[i].took > ops[j].took })
	longest := ops[0]
	codes := map[string]int{}
	for _, op := range ops {
		codes[fmt.Sprintf("%s write=%v %d", op.node, op.write, op.status)]++
	}
	t.Logf("%d requests to the survivors; longest %v (%s write=%v, %d, sent %v after the stop); answers %v",
		len(ops), longest.took.Round(time.Millisecond), longest.node, longest.write, longest.status,
		longest.start.Sub(stoppedAt).Round(time.Millisecond), codes)
	if firstWrite.IsZero() {
		t.Fatalf("no write through follower %s succeeded within 20 s of the election", follower.nodeID)
	}
	t.Logf("first write through follower %s acknowledged %v after the election", follower.nodeID, firstWrite.Sub(electedAt).Round(time.Millisecond))
	// Contract bound of a forward with no wait_ms: a few seconds, however
	// slow the machine (the forward timeout is 3 s, the new leader is
	// usually known well before).
	if bound := 5 * time.Second; longest.took > bound {
		t.Fatalf("a request to %s waited %v (write=%v, answer %d, err %v), over %v", longest.node, longest.took, longest.write, longest.status, longest.err, bound)
	}
	if bound := 10 * time.Second; firstWrite.Sub(electedAt) > bound {
		t.Fatalf("first write through a follower %v after the election, over %v", firstWrite.Sub(electedAt), bound)
	}
	for _, op := range ops {
		if op.err != nil {
			t.Fatalf("request to %s failed without an answer: %v", op.node, op.err)
		}
		if op.status >= 500 && op.status != http.StatusServiceUnavailable && op.status != http.StatusGatewayTimeout {
			t.Fatalf("request to %s answered %d", op.node, op.status)
		}
		if !op.write && op.status == http.StatusGatewayTimeout {
			t.Fatalf("a read through %s answered INDETERMINATE", op.node)
		}
	}

	// The stopped server resumes and follows.
	if err := leader.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.waitFormed(c.nodes)
}
