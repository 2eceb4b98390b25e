package main

// Process-level cluster tests: three `leasehold server` processes on
// loopback form a cluster through gossip (--join, --bootstrap-expect 3) and
// are SIGKILLed and restarted with their data directories.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

const (
	clusterTick = 50 * time.Millisecond
	// clusterRaftTimeout is the servers' --raft-timeout: four times the
	// default, so that a leader keeps its lease (half of it) through the
	// scheduling stalls of a busy machine running three servers and the
	// tests beside them, instead of elections following one another.
	clusterRaftTimeout = 2 * time.Second
	// clusterTimeout bounds every wait: it only guards against a hang, so
	// it is generous (elections take several raft timeouts on a loaded
	// machine, restarts and catch-up more).
	clusterTimeout = 60 * time.Second
)

// testCluster is three servers that form one cluster.
type testCluster struct {
	t     *testing.T
	nodes []*server
}

// newCluster starts three servers (n1, n2, n3) and waits until they agree
// on one leader, with extra server flags. Their logs are printed if the
// test fails.
func newCluster(t *testing.T, extra ...string) *testCluster {
	t.Helper()
	c := &testCluster{t: t}
	var gossip []string
	for i := range 3 {
		s := newServer(t)
		s.nodeID = fmt.Sprintf("n%d", i+1)
		s.tickPeriod = clusterTick.String()
		c.nodes = append(c.nodes, s)
		gossip = append(gossip, s.gossip)
	}
	for _, s := range c.nodes {
		s.extra = append([]string{"--join", strings.Join(gossip, ","), "--bootstrap-expect", "3",
			"--raft-timeout", clusterRaftTimeout.String()}, extra...)
	}
	// Registered before the servers' own cleanups, so it runs after they
	// have been killed and the logs are complete.
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range c.nodes {
				t.Logf("---- log of %s (http %s) ----\n%s", s.nodeID, s.http, tail(s.log(), 64<<10))
			}
		}
	})
	for _, s := range c.nodes {
		s.launch()
	}
	c.waitAllReady()
	c.waitFormed(c.nodes)
	return c
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// waitAllReady waits until every server answers /readyz with 200 (within
// clusterTimeout: a restarted cluster elects a leader before any is ready).
func (c *testCluster) waitAllReady() {
	c.t.Helper()
	for _, s := range c.nodes {
		eventuallyMsg(c.t, clusterTimeout, func() (bool, string) {
			select {
			case <-s.exited:
				c.t.Fatalf("%s exited before ready; log:\n%s", s.nodeID, tail(s.log(), 64<<10))
			default:
			}
			code, _, body, err := call("GET", "http://"+s.http+"/readyz", nil, nil, nil)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", s.nodeID, err)
			}
			return code == http.StatusOK, fmt.Sprintf("%s: /readyz %d %s", s.nodeID, code, body)
		})
	}
}

// clusterHTTP bounds every request of the cluster tests.
var clusterHTTP = &http.Client{Timeout: 5 * time.Second}

// call sends a request and decodes a 2xx JSON answer into out. It returns
// the status (0 on a transport failure), the headers and the body.
func call(method, url string, body any, header map[string]string, out any) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := clusterHTTP.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header, b, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, resp.Header, b, fmt.Errorf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode, resp.Header, b, nil
}

// status is the server's own view of the cluster (?stale=true: a
// follower would forward a plain GET /v1/cluster to the leader).
func (s *server) status() (*wire.ClusterStatus, error) {
	var st wire.ClusterStatus
	code, _, body, err := call("GET", "http://"+s.http+"/v1/cluster?stale=true", nil, nil, &st)
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET /v1/cluster: %d %s", code, body)
	}
	return &st, nil
}

// waitFormed waits until every server of up reports the same leader, that
// leader (one of up) reports itself leader and no other server does, and
// every view has the three voters. It returns the leader.
func (c *testCluster) waitFormed(up []*server) *server {
	c.t.Helper()
	var leader *server
	var last string
	deadline := time.Now().Add(clusterTimeout)
	for {
		leader, last = c.formed(up)
		if leader != nil {
			return leader
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no agreed leader among %d servers within %v: %s", len(up), clusterTimeout, last)
		}
		<-time.After(10 * time.Millisecond)
	}
}

func (c *testCluster) formed(up []*server) (*server, string) {
	leaderID := ""
	var leader *server
	for _, s := range up {
		st, err := s.status()
		if err != nil {
			return nil, fmt.Sprintf("%s: %v", s.nodeID, err)
		}
		if st.Leader == "" || leaderID != "" && st.Leader != leaderID {
			return nil, fmt.Sprintf("%s sees leader %q", s.nodeID, st.Leader)
		}
		leaderID = st.Leader
		if (st.State == "Leader") != (st.NodeID == leaderID) {
			return nil, fmt.Sprintf("%s is %s with leader %s", s.nodeID, st.State, st.Leader)
		}
		if st.State == "Leader" {
			leader = s
		}
		voters := 0
		for _, m := range st.Members {
			if m.Voter {
				voters++
			}
		}
		if len(st.Members) != 3 || voters != 3 {
			return nil, fmt.Sprintf("%s sees members %+v", s.nodeID, st.Members)
		}
	}
	if leader == nil {
		return nil, fmt.Sprintf("leader %s is not among the servers up", leaderID)
	}
	return leader, ""
}

func (c *testCluster) others(of ...*server) []*server {
	var out []*server
next:
	for _, s := range c.nodes {
		for _, o := range of {
			if s == o {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// waitSameApplied waits until the servers report one applied index.
func (c *testCluster) waitSameApplied(up []*server) uint64 {
	c.t.Helper()
	var got []uint64
	var applied uint64
	eventuallyMsg(c.t, clusterTimeout, func() (bool, string) {
		got = got[:0]
		for _, s := range up {
			st, err := s.status()
			if err != nil {
				return false, err.Error()
			}
			got = append(got, st.AppliedIndex)
		}
		for _, a := range got[1:] {
			if a != got[0] {
				return false, fmt.Sprintf("applied indexes %v", got)
			}
		}
		applied = got[0]
		return true, ""
	})
	return applied
}

// eventuallyMsg is eventually with the last reason the condition gave.
func eventuallyMsg(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %s", timeout, why)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// acquire sends POST /v1/leases to s and wants 201.
func acquire(t *testing.T, s *server, key, holder string, ttl time.Duration) *wire.Lease {
	t.Helper()
	var l wire.Lease
	code, _, body, err := call("POST", "http://"+s.http+"/v1/leases",
		map[string]any{"key": key, "holder": holder, "ttl_ms": ttl.Milliseconds()}, nil, &l)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("acquire %s on %s: %d %s %v", key, s.nodeID, code, body, err)
	}
	if l.Token == "" || l.FencingToken == 0 {
		t.Fatalf("acquire %s on %s: %s", key, s.nodeID, body)
	}
	return &l
}

func release(t *testing.T, s *server, l *wire.Lease) {
	t.Helper()
	code, _, body, err := call("DELETE", "http://"+s.http+"/v1/leases/"+l.LeaseID, nil,
		map[string]string{"X-Lease-Token": l.Token}, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("release %s on %s: %d %s %v", l.LeaseID, s.nodeID, code, body, err)
	}
}

// getLease reads a lease from s; stale answers from s's own state.
func getLease(s *server, id string, stale bool) (*wire.Lease, int, error) {
	u := "http://" + s.http + "/v1/leases/" + id
	if stale {
		u += "?stale=true"
	}
	var l wire.Lease
	code, _, body, err := call("GET", u, nil, nil, &l)
	if err != nil {
		return nil, code, err
	}
	if code != 200 {
		return nil, code, fmt.Errorf("GET %s on %s: %d %s", id, s.nodeID, code, body)
	}
	return &l, code, nil
}

// settling says whether an answer of call is one a cluster gives while
// leadership moves (a loaded machine: an election between two requests):
// no answer (code 0, or a body cut short), 503 NO_LEADER or 504
// INDETERMINATE. A request that got one may be sent again until the
// cluster answers.
func settling(code int, err error) bool {
	return err != nil || code == 0 || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// acquireSettled is acquire through s that is sent again while leadership
// moves; an idempotency key makes a retry of an acquire that was applied
// answer the same lease (200) instead of a second one.
func acquireSettled(t *testing.T, s *server, key, holder string, ttl time.Duration) *wire.Lease {
	t.Helper()
	var l wire.Lease
	req := map[string]any{"key": key, "holder": holder, "ttl_ms": ttl.Milliseconds(), "idempotency_key": "settled/" + key + "/" + holder}
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		l = wire.Lease{}
		code, _, body, err := call("POST", "http://"+s.http+"/v1/leases", req, nil, &l)
		if settling(code, err) {
			return false, fmt.Sprintf("acquire %s on %s: %d %s %v", key, s.nodeID, code, body, err)
		}
		if code != http.StatusCreated && code != http.StatusOK {
			t.Fatalf("acquire %s on %s: %d %s", key, s.nodeID, code, body)
		}
		return true, ""
	})
	if l.Token == "" || l.FencingToken == 0 || l.Key != key || l.State != "active" {
		t.Fatalf("acquire %s on %s: %+v", key, s.nodeID, l)
	}
	return &l
}

// releaseSettled is release through s that is sent again while leadership
// moves; after an answer that left it open, LEASE_RELEASED says the first
// one was applied.
func releaseSettled(t *testing.T, s *server, l *wire.Lease) {
	t.Helper()
	unsure := false
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		code, _, body, err := call("DELETE", "http://"+s.http+"/v1/leases/"+l.LeaseID, nil,
			map[string]string{"X-Lease-Token": l.Token}, nil)
		switch {
		case settling(code, err):
			unsure = true
			return false, fmt.Sprintf("release %s on %s: %d %s %v", l.LeaseID, s.nodeID, code, body, err)
		case code == http.StatusOK, unsure && code == http.StatusConflict && strings.Contains(string(body), string(wire.CodeLeaseReleased)):
			return true, ""
		}
		t.Fatalf("release %s on %s: %d %s", l.LeaseID, s.nodeID, code, body)
		return false, ""
	})
}

// readLease is a linearizable read of a lease through s, sent again while
// leadership moves.
func readLease(t *testing.T, s *server, id string) *wire.Lease {
	t.Helper()
	var got *wire.Lease
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		l, code, err := getLease(s, id, false)
		if err != nil && settling(code, nil) {
			return false, err.Error()
		}
		if err != nil {
			t.Fatalf("read %s through %s: %v", id, s.nodeID, err)
		}
		got = l
		return true, ""
	})
	return got
}

// waitLeaseEverywhere waits until every server of up has applied the
// lease (a stale read of its own state) with the given fencing token and
// state.
func waitLeaseEverywhere(t *testing.T, up []*server, l *wire.Lease, state string) {
	t.Helper()
	for _, s := range up {
		eventuallyMsg(t, clusterTimeout, func() (bool, string) {
			got, _, err := getLease(s, l.LeaseID, true)
			if err != nil {
				return false, err.Error()
			}
			if got.FencingToken != l.FencingToken || got.Key != l.Key || got.State != state {
				return false, fmt.Sprintf("%s has %+v, want fence %d state %s", s.nodeID, got, l.FencingToken, state)
			}
			return true, ""
		})
	}
}

// metricCount reads one leasehold_http_requests_total series of s.
func metricCount(t *testing.T, s *server, method, route, code string) int {
	t.Helper()
	_, _, body, err := call("GET", "http://"+s.http+"/metrics", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	series := fmt.Sprintf(`leasehold_http_requests_total{code=%q,method=%q,route=%q} `, code, method, route)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, series); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// sseEvent is one event read off a raw SSE stream.
type sseEvent struct {
	id, typ string
	ev      wire.Event
}

// openEvents opens GET /v1/events on s and sends the events it reads to the
// returned channel until ctx ends or the stream breaks.
func openEvents(t *testing.T, ctx context.Context, s *server, query, lastEventID string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.http+"/v1/events?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("open events on %s: %v", s.nodeID, err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("open events on %s: %d %s", s.nodeID, resp.StatusCode, b)
	}
	ch := make(chan sseEvent, 1024)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur.typ != "" {
					select {
					case ch <- cur:
					case <-ctx.Done():
						return
					}
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.ev); err != nil {
					cur.typ = "undecodable: " + line
				}
			}
		}
	}()
	return ch
}

// readEvents reads n events from ch within clusterTimeout.
func readEvents(t *testing.T, ch <-chan sseEvent, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	timeout := time.After(clusterTimeout)
	for len(out) < n {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("event stream ended after %d of %d events", len(out), n)
			}
			out = append(out, e)
		case <-timeout:
			t.Fatalf("only %d of %d events within %v", len(out), n, clusterTimeout)
		}
	}
	return out
}

// TestClusterFormsAndForwards: three servers form one cluster; a follower
// forwards writes and linearizable reads to the leader; an event stream
// resumes on another server without a gap or a duplicate.
func TestClusterFormsAndForwards(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	followers := c.others(leader)
	f1, f2 := followers[0], followers[1]
	t.Logf("leader %s, followers %s %s", leader.nodeID, f1.nodeID, f2.nodeID)

	// A write sent to a follower is forwarded: 201, on every server.
	l := acquire(t, f1, "fwd/a", "w", 30*time.Second)
	waitLeaseEverywhere(t, c.nodes, l, "active")
	if _, _, err := getLease(leader, l.LeaseID, true); err != nil {
		t.Fatal(err)
	}
	// The lease is held whichever server is asked.
	for _, s := range c.nodes {
		code, _, body, err := call("POST", "http://"+s.http+"/v1/leases",
			map[string]any{"key": "fwd/a", "holder": "other", "ttl_ms": 5000}, nil, nil)
		if err != nil || code != http.StatusConflict || !strings.Contains(string(body), string(wire.CodeLeaseHeld)) {
			t.Fatalf("second acquire of fwd/a on %s: %d %s %v", s.nodeID, code, body, err)
		}
	}

	// Linearizable reads on a follower are forwarded: a lease acquired
	// through one follower is at once visible through the other, and the
	// leader answered the reads.
	const rounds = 10
	before := metricCount(t, leader, "GET", "/v1/leases/:id", "200")
	for i := range rounds {
		l := acquire(t, f1, fmt.Sprintf("lin/%d", i), "w", 30*time.Second)
		got, _, err := getLease(f2, l.LeaseID, false)
		if err != nil {
			t.Fatalf("linearizable read on %s right after an acquire through %s: %v", f2.nodeID, f1.nodeID, err)
		}
		if got.FencingToken != l.FencingToken || got.State != "active" {
			t.Fatalf("linearizable read: %+v, want fence %d", got, l.FencingToken)
		}
	}
	if after := metricCount(t, leader, "GET", "/v1/leases/:id", "200"); after-before < rounds {
		t.Fatalf("leader answered %d of %d linearizable reads sent to a follower", after-before, rounds)
	}
	// Renew and release through a follower.
	code, _, body, err := call("POST", "http://"+f2.http+"/v1/leases/"+l.LeaseID+"/renew", nil,
		map[string]string{"X-Lease-Token": l.Token}, nil)
	if err != nil || code != 200 {
		t.Fatalf("renew through %s: %d %s %v", f2.nodeID, code, body, err)
	}
	release(t, f2, l)
	waitLeaseEverywhere(t, c.nodes, l, "released")

	// An event stream opened on one server and resumed on another with
	// Last-Event-ID: every event once, in order.
	st, err := leader.status()
	if err != nil {
		t.Fatal(err)
	}
	var want []string // type and lease id of each event, in order
	pair := func(s *server, i int) {
		l := acquire(t, s, fmt.Sprintf("ev/%d", i), "w", 30*time.Second)
		release(t, s, l)
		want = append(want, "acquired "+l.LeaseID, "released "+l.LeaseID)
	}
	for i := range 10 {
		pair(c.nodes[i%3], i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	ctxA, cancelA := context.WithCancel(ctx)
	first := readEvents(t, openEvents(t, ctxA, f1, fmt.Sprintf("prefix=ev/&after_index=%d", st.AppliedIndex), ""), 7)
	cancelA()
	streamB := openEvents(t, ctx, f2, "prefix=ev/", first[len(first)-1].id)
	for i := 10; i < 20; i++ {
		pair(c.nodes[i%3], i)
	}
	rest := readEvents(t, streamB, len(want)-len(first))
	all := append(first, rest...)
	var got []string
	for i, e := range all {
		if e.ev.Lease == nil || e.id == "" || e.ev.ID != e.id || e.typ != e.ev.Type {
			t.Fatalf("event %d malformed: %+v", i, e)
		}
		got = append(got, e.typ+" "+e.ev.Lease.LeaseID)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events across the resume (first %d from %s, then %s):\n%s\nwant:\n%s",
			len(first), f1.nodeID, f2.nodeID, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Nothing more arrives (no duplicate after the last one).
	select {
	case e, ok := <-streamB:
		if ok {
			t.Fatalf("unexpected event after the last write: %+v", e)
		}
	case <-time.After(5 * clusterTick):
	}
}

// waitNewLeader polls the survivors' own views until one reports itself
// leader and returns it with the time since killedAt.
func (c *testCluster) waitNewLeader(survivors []*server, killedAt time.Time) (*server, time.Duration) {
	c.t.Helper()
	deadline := killedAt.Add(clusterTimeout)
	for time.Now().Before(deadline) {
		for _, s := range survivors {
			if st, err := s.status(); err == nil && st.State == "Leader" {
				return s, time.Since(killedAt)
			}
		}
		<-time.After(5 * time.Millisecond)
	}
	c.t.Fatalf("no new leader within %v of the kill", clusterTimeout)
	return nil, 0
}

// sigkillAll sends SIGKILL to every server first, then waits for them.
func sigkillAll(servers ...*server) {
	for _, s := range servers {
		s.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, s := range servers {
		<-s.exited
	}
}

// TestClusterLeaderKill9 SIGKILLs the leader right after an acknowledged
// acquire: another server takes over within the bound, the lease keeps its
// fencing token and its remaining time (neither reset nor shortened), new
// acquires succeed, and the killed server rejoins as a follower.
func TestClusterLeaderKill9(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	const ttl = 20 * time.Second

	// An older lease whose countdown has visibly run before the kill.
	oldSent := time.Now()
	old := acquire(t, leader, "kill/old", "w", ttl)
	var oldBefore *wire.Lease
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		l, _, err := getLease(leader, old.LeaseID, false)
		if err != nil {
			return false, err.Error()
		}
		oldBefore = l
		return l.RemainingMS <= (ttl - time.Second).Milliseconds(), fmt.Sprintf("remaining %d", l.RemainingMS)
	})

	// The acquire right before the kill, through a follower: acknowledged
	// means committed.
	sent := time.Now()
	fresh := acquire(t, c.others(leader)[0], "kill/fresh", "w", ttl)
	killedAt := time.Now()
	leader.kill()
	survivors := c.others(leader)
	newLeader, took := c.waitNewLeader(survivors, killedAt)
	t.Logf("failover: %s killed, %s reports itself leader %v after the SIGKILL (tick %v)", leader.nodeID, newLeader.nodeID, took, clusterTick)
	// A follower notices within 1-2 raft timeouts; an election round takes
	// 1-2 more, and two survivors may split their votes once.
	if bound := 8 * clusterRaftTimeout; took > bound {
		t.Fatalf("new leader after %v, over %v (raft timeout %v)", took, bound, clusterRaftTimeout)
	}
	c.waitFormedPartial(survivors, newLeader)

	// Let the new leader commit a few ticks so that a reset countdown
	// would show: four after the fresh acquire's, so counted from a
	// linearizable status (a new leader's own view may still lag what it
	// has to apply from its predecessor on a loaded machine, and four ticks
	// after that tick were less than four after the acquire's).
	var startTick uint64
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		var st wire.ClusterStatus
		code, _, body, err := call("GET", "http://"+newLeader.http+"/v1/cluster", nil, nil, &st)
		if err != nil || code != http.StatusOK {
			return false, fmt.Sprintf("linearizable status: %d %s %v", code, body, err)
		}
		startTick = st.Tick
		return true, ""
	})
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		st, err := newLeader.status()
		if err != nil {
			return false, err.Error()
		}
		return st.Tick >= startTick+4, fmt.Sprintf("tick %d", st.Tick)
	})

	for _, s := range survivors {
		for _, tc := range []struct {
			l      *wire.Lease
			sent   time.Time
			before int64 // remaining_ms before the kill: an upper bound
		}{
			{old, oldSent, oldBefore.RemainingMS},
			{fresh, sent, ttl.Milliseconds() - 4*clusterTick.Milliseconds()},
		} {
			got, _, err := getLease(s, tc.l.LeaseID, false)
			elapsed := time.Since(tc.sent)
			if err != nil {
				t.Fatalf("lease %s after failover, read through %s: %v", tc.l.Key, s.nodeID, err)
			}
			if got.State != "active" || got.FencingToken != tc.l.FencingToken {
				t.Fatalf("lease %s after failover: %+v, want active with fence %d", tc.l.Key, got, tc.l.FencingToken)
			}
			floor := (ttl - elapsed - 2*clusterTick).Milliseconds()
			if got.RemainingMS > tc.before || got.RemainingMS < floor {
				t.Fatalf("lease %s after failover: remaining %d ms, want %d..%d (ttl %v, %v since sent)",
					tc.l.Key, got.RemainingMS, floor, tc.before, ttl, elapsed)
			}
			t.Logf("lease %s through %s: remaining %d ms, %v after the acquire was sent", tc.l.Key, s.nodeID, got.RemainingMS, elapsed.Round(time.Millisecond))
		}
	}

	// The keys stay held; new acquires succeed on either survivor with
	// higher fencing tokens.
	for _, s := range survivors {
		code, _, body, _ := call("POST", "http://"+s.http+"/v1/leases",
			map[string]any{"key": "kill/fresh", "holder": "thief", "ttl_ms": 5000}, nil, nil)
		if code != http.StatusConflict || !strings.Contains(string(body), string(wire.CodeLeaseHeld)) {
			t.Fatalf("acquire of the held key through %s: %d %s", s.nodeID, code, body)
		}
	}
	var last *wire.Lease
	for i, s := range survivors {
		last = acquire(t, s, fmt.Sprintf("kill/after/%d", i), "w", ttl)
		if last.FencingToken <= fresh.FencingToken {
			t.Fatalf("fence %d after failover, not above %d", last.FencingToken, fresh.FencingToken)
		}
	}

	// The killed server restarts with its data directory, rejoins as a
	// follower and catches up.
	leader.launch()
	leader.waitReady()
	if got := c.waitFormed(c.nodes); got != newLeader {
		t.Logf("leadership moved again, to %s", got.nodeID)
	}
	// A member again: a follower, or the leader if leadership moved to it
	// meanwhile (elections on a loaded machine), never stuck campaigning.
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		st, err := leader.status()
		if err != nil {
			return false, err.Error()
		}
		return st.State == "Follower" || st.State == "Leader" && st.Leader == leader.nodeID, "restarted server is " + st.State
	})
	waitLeaseEverywhere(t, c.nodes, last, "active")
	waitLeaseEverywhere(t, c.nodes, fresh, "active")
	c.waitSameApplied(c.nodes)
}

// waitFormedPartial waits until the servers of up agree that leader leads
// (the third server is down).
func (c *testCluster) waitFormedPartial(up []*server, leader *server) {
	c.t.Helper()
	eventuallyMsg(c.t, clusterTimeout, func() (bool, string) {
		for _, s := range up {
			st, err := s.status()
			if err != nil {
				return false, err.Error()
			}
			if st.Leader != leader.nodeID {
				return false, fmt.Sprintf("%s sees leader %q", s.nodeID, st.Leader)
			}
		}
		return true, ""
	})
}

// TestClusterFollowerKill9: with a follower SIGKILLed, writes keep working
// through the leader and the other follower; the follower restarts and
// catches up.
func TestClusterFollowerKill9(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	followers := c.others(leader)
	victim, other := followers[0], followers[1]
	before := acquire(t, other, "fk/before", "w", 30*time.Second)
	waitLeaseEverywhere(t, c.nodes, before, "active")

	victim.kill()
	var acked []*wire.Lease
	for i := range 10 {
		s := leader
		if i%2 == 1 {
			s = other
		}
		acked = append(acked, acquire(t, s, fmt.Sprintf("fk/%d", i), "w", 30*time.Second))
	}
	release(t, other, acked[0])
	// The two left are a cluster with a leader (the same one, unless a
	// loaded machine made it miss its lease and an election followed).
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		ls, lerr := leader.status()
		ost, oerr := other.status()
		if lerr != nil || oerr != nil {
			return false, fmt.Sprint(lerr, oerr)
		}
		ok := ls.Leader != "" && ls.Leader == ost.Leader && ls.Leader != victim.nodeID
		return ok, fmt.Sprintf("%s sees leader %q, %s sees %q", leader.nodeID, ls.Leader, other.nodeID, ost.Leader)
	})

	victim.launch()
	victim.waitReady()
	c.waitFormed(c.nodes)
	waitLeaseEverywhere(t, c.nodes, acked[0], "released")
	for _, l := range acked[1:] {
		waitLeaseEverywhere(t, []*server{victim}, l, "active")
	}
	c.waitSameApplied(c.nodes)
	after := acquire(t, victim, "fk/after", "w", 30*time.Second)
	if after.FencingToken <= acked[len(acked)-1].FencingToken {
		t.Fatalf("fence %d after the restart, not above %d", after.FencingToken, acked[len(acked)-1].FencingToken)
	}
}

// TestClusterKillAll9 SIGKILLs all three servers right after an
// acknowledged acquire and release; after a restart of all three both are
// there and fencing tokens keep rising.
//
// Leadership may move at any point on a loaded machine: requests that get
// no answer, NO_LEADER or INDETERMINATE are sent again (acquires with an
// idempotency key), and the TTLs outlast any wait of the test, so that
// only a lost or changed lease fails it.
func TestClusterKillAll9(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	f := c.others(leader)[0]
	const ttl = 10 * time.Minute
	held := acquireSettled(t, f, "all/held", "w", ttl)
	gone := acquireSettled(t, leader, "all/gone", "w", ttl)
	releaseSettled(t, f, gone)
	sigkillAll(c.nodes...)

	for _, s := range c.nodes {
		s.launch()
	}
	c.waitAllReady()
	c.waitFormed(c.nodes)
	for _, s := range c.nodes {
		got := readLease(t, s, held.LeaseID)
		if got.State != "active" || got.FencingToken != held.FencingToken {
			t.Fatalf("acknowledged acquire after restarting all, read through %s: %+v", s.nodeID, got)
		}
		got = readLease(t, s, gone.LeaseID)
		if got.State != "released" || got.FencingToken != gone.FencingToken {
			t.Fatalf("acknowledged release after restarting all, read through %s: %+v", s.nodeID, got)
		}
	}
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		code, _, body, err := call("POST", "http://"+leader.http+"/v1/leases",
			map[string]any{"key": "all/held", "holder": "thief", "ttl_ms": 5000}, nil, nil)
		if settling(code, err) {
			return false, fmt.Sprintf("acquire of the held key: %d %s %v", code, body, err)
		}
		if code != http.StatusConflict || !strings.Contains(string(body), string(wire.CodeLeaseHeld)) {
			t.Fatalf("acquire of the held key after restarting all: %d %s", code, body)
		}
		return true, ""
	})
	again := acquireSettled(t, f, "all/gone", "w2", ttl)
	if again.FencingToken <= gone.FencingToken || again.FencingToken <= held.FencingToken {
		t.Fatalf("fence %d after restarting all, not above %d and %d", again.FencingToken, gone.FencingToken, held.FencingToken)
	}
	waitLeaseEverywhere(t, c.nodes, again, "active")
}

// TestClusterRemoveMember removes a follower through DELETE
// /v1/cluster/members/:id: leases are untouched and the two left go on.
//
// Leadership may move at any point on a loaded machine (the two left need
// not keep the first leader): requests that get no answer, NO_LEADER or
// INDETERMINATE are sent again.
func TestClusterRemoveMember(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	followers := c.others(leader)
	gone, stay := followers[0], followers[1]
	up := []*server{leader, stay}
	const ttl = 10 * time.Minute
	sent := time.Now()
	l := acquireSettled(t, gone, "rm/held", "w", ttl)
	waitLeaseEverywhere(t, c.nodes, l, "active")
	before := readLease(t, leader, l.LeaseID)

	// removed says whether s's view has gone out of the voters, listed as
	// removed (gossip still knows it), and two voters that agree on a
	// leader among themselves.
	removed := func(s *server) (bool, string) {
		st, err := s.status()
		if err != nil {
			return false, err.Error()
		}
		voters := 0
		for _, m := range st.Members {
			if m.Voter {
				voters++
			}
			if m.ID == gone.nodeID && (m.Voter || m.Health != "removed") {
				return false, fmt.Sprintf("%s lists %s as %+v", s.nodeID, gone.nodeID, m)
			}
		}
		if (st.Leader != leader.nodeID && st.Leader != stay.nodeID) || voters != 2 {
			return false, fmt.Sprintf("%s: leader %q members %+v", s.nodeID, st.Leader, st.Members)
		}
		return true, ""
	}
	// The removal, sent again while leadership moves unless a view shows it
	// applied (an answer that left it open may have been).
	unsure := false
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		if unsure {
			if ok, _ := removed(stay); ok {
				return true, ""
			}
		}
		code, _, body, err := call("DELETE", "http://"+stay.http+"/v1/cluster/members/"+gone.nodeID, nil, nil, nil)
		if code == http.StatusOK {
			return true, ""
		}
		if !settling(code, err) && !unsure {
			t.Fatalf("remove %s through %s: %d %s %v", gone.nodeID, stay.nodeID, code, body, err)
		}
		unsure = true
		return false, fmt.Sprintf("remove %s through %s: %d %s %v", gone.nodeID, stay.nodeID, code, body, err)
	})
	eventuallyMsg(t, clusterTimeout, func() (bool, string) {
		var leaders []string
		for _, s := range up {
			if ok, why := removed(s); !ok {
				return false, why
			}
			st, err := s.status()
			if err != nil {
				return false, err.Error()
			}
			leaders = append(leaders, st.Leader)
		}
		return leaders[0] == leaders[1], fmt.Sprintf("the two left see leaders %q", leaders)
	})
	for _, s := range up {
		got := readLease(t, s, l.LeaseID)
		elapsed := time.Since(sent)
		if got.State != "active" || got.FencingToken != l.FencingToken {
			t.Fatalf("lease after the removal, through %s: %+v", s.nodeID, got)
		}
		// Never reset (not above what it was) nor shortened (ticks never
		// run faster than real time).
		if floor := (ttl - elapsed - 2*clusterTick).Milliseconds(); got.RemainingMS > before.RemainingMS || got.RemainingMS < floor {
			t.Fatalf("remaining %d ms after the removal, want %d..%d", got.RemainingMS, floor, before.RemainingMS)
		}
	}
	next := acquireSettled(t, stay, "rm/next", "w", ttl)
	if next.FencingToken <= l.FencingToken {
		t.Fatalf("fence %d after the removal, not above %d", next.FencingToken, l.FencingToken)
	}
	releaseSettled(t, stay, l)
	waitLeaseEverywhere(t, up, l, "released")
}
