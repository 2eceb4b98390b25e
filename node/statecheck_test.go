package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// checkCluster is a three-server in-memory cluster whose state checks
// reach each other through the test's hooks (in-memory servers have no
// node-to-node streams), with skew on n3: it drops the acquire of the key
// "diverge-me" when skewOn is set (a deliberately diverged replica).
func checkCluster(t *testing.T, skewOn *atomic.Bool, adjust ...func(*Config)) *testCluster {
	c := newTestCluster(t)
	hooks := func(cfg *Config) {
		for _, a := range adjust {
			a(cfg)
		}
		cfg.StateCheckInterval = time.Hour // checks run when the test says
		cfg.peerHashHook = func(ctx context.Context, id string, at uint64) (string, error) {
			n := c.node(id)
			if n == nil {
				return "", fmt.Errorf("%s is down", id)
			}
			h, err := n.rep.hashAt(ctx, at)
			if err != nil {
				return "", err
			}
			return h.sum, nil
		}
		cfg.divergedHook = func(id string, d divergedNotice) {
			if n := c.node(id); n != nil {
				n.sc.markDiverged(d)
			}
		}
		if cfg.NodeID == "n3" {
			cfg.skewApply = func(cmd fsm.Command) fsm.Command { return skew(cmd, skewOn) }
		}
	}
	cfg := clusterConfig("n1")
	hooks(&cfg)
	n1 := c.start(cfg)
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		hooks(&cfg)
		c.start(cfg)
	}
	c.voters(3)
	return c
}

// skew replaces an acquire of "diverge-me" with a tick that changes
// nothing (a duplicate), while on is set.
func skew(cmd fsm.Command, on *atomic.Bool) fsm.Command {
	if !on.Load() {
		return cmd
	}
	drop := func(c fsm.Command) fsm.Command {
		if a, ok := c.(*fsm.Acquire); ok && a.Key == "diverge-me" {
			return &fsm.Tick{}
		}
		return c
	}
	if b, ok := cmd.(*fsm.Batch); ok {
		nb := &fsm.Batch{Commands: make([]fsm.Command, len(b.Commands))}
		for i, c := range b.Commands {
			nb.Commands[i] = drop(c)
		}
		return nb
	}
	return drop(cmd)
}

// TestStateCheckFindsDivergedServer: a replica that applied an entry
// differently is found by the leader's check, told so, and takes itself
// out of service (not ready, with the reason; its gauge is 1); the others
// stay ready; a healthy cluster under load is found to agree, check after
// check.
func TestStateCheckFindsDivergedServer(t *testing.T) {
	var skewOn atomic.Bool
	c := checkCluster(t, &skewOn)
	ctx := context.Background()
	l := c.leader()
	if l.cfg.NodeID == "n3" {
		l.TransferLeadership(ctx, "")
		l = c.leader("n3")
	}

	// Healthy, under load: every check agrees.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("load/%d/%d", w, i%50), Holder: "w", TTLMS: 500})
			}
		})
	}
	for range 5 {
		res := l.sc.checkStates(ctx)
		if res == nil || res.majority == "" || len(res.odd) > 0 || len(res.sums) != 3 {
			close(stop)
			wg.Wait()
			t.Fatalf("healthy cluster under load: %+v", res)
		}
	}
	close(stop)
	wg.Wait()
	if got := metricValue(t, l.sc.metrics.checks.WithLabelValues("agree")); got < 5 {
		t.Fatalf("agreeing checks counted: %v", got)
	}

	// n3 drops one acquire: the next check finds it.
	skewOn.Store(true) // until the end: n3 may apply the entry any time
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "diverge-me", Holder: "w", TTLMS: 600000}); err != nil {
		t.Fatal(err)
	}
	odd := c.node("n3")
	var res *stateCheckResult
	waitFor(t, 10*time.Second, func() bool {
		res = l.sc.checkStates(ctx)
		return res != nil && len(res.odd) == 1
	})
	if res.odd[0] != "n3" {
		t.Fatalf("check found %v odd, want n3", res.odd)
	}
	err := odd.ReadyErr()
	if err == nil || !strings.Contains(err.Error(), "differs from the cluster's") {
		t.Fatalf("the diverged server's readiness: %v", err)
	}
	if g := metricValue(t, odd.sc.metrics.diverged); g != 1 {
		t.Fatalf("diverged gauge %v", g)
	}
	if m := metricValue(t, l.sc.metrics.mismatches); m < 1 {
		t.Fatalf("mismatches counted on the leader: %v", m) // (the term's own first check may have counted one too)
	}
	for _, id := range []string{"n1", "n2"} {
		if n := c.node(id); n.ReadyErr() != nil {
			t.Fatalf("%s not ready: %v", id, n.ReadyErr())
		}
	}
}

// TestStateCheckAtStart: a server whose state differs when it starts (it
// replays its log differently) is found by its own check against the
// leader before it reports ready.
func TestStateCheckAtStart(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside the other parallel tests
	var skewOn atomic.Bool
	c := checkCluster(t, &skewOn)
	ctx := context.Background()
	l := c.leader()
	if l.cfg.NodeID == "n3" {
		c.node("n3").TransferLeadership(ctx, "")
		l = c.leader("n3")
	}
	n3 := c.node("n3")
	// The check at start ends by itself, with a verdict or, without a
	// majority's answer, after startupCheckFor and the round under way:
	// wait for its end, not for a guess of its length (10 s here, and 40 s
	// below, were shorter than what a loaded machine may take).
	checkEnds := max(startupCheckFor, 2*n3.cfg.hashWait(8)) + 10*time.Second + n3.cfg.hashWait(8) + 10*time.Second
	waitFor(t, checkEnds, func() bool { return n3.sc.startChecked.Load() })
	if n3.sc.diverged.Load() != nil {
		t.Fatalf("a healthy server found itself diverged at start: %s", *n3.sc.diverged.Load())
	}
	waitFor(t, 10*time.Second, func() bool { return n3.ReadyErr() == nil })
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "diverge-me", Holder: "w", TTLMS: 600000}); err != nil {
		t.Fatal(err)
	}
	// n3 restarts and replays its log with the skew on.
	cfg := n3.cfg
	target := l.AppliedIndex()
	waitFor(t, 10*time.Second, func() bool { return n3.AppliedIndex() >= target })
	c.stop("n3")
	skewOn.Store(true)
	defer skewOn.Store(false)
	n3 = c.start(cfg)
	waitFor(t, checkEnds, func() bool { return n3.sc.startChecked.Load() || n3.sc.diverged.Load() != nil })
	if n3.sc.diverged.Load() == nil {
		// In memory a restart is a new server (a new incarnation): the
		// leader replaces the old member and n3 gets the log again. Its
		// check at start may end before it holds a configuration to
		// compare with (nothing to compare: no verdict, as for a new
		// server), and whether it does depends on timing. Then the check
		// runs once more, as it would at the start of a server that kept
		// its data: once n3 is a voter again and has replayed the log.
		t.Log("the check at start ended without a verdict (a new server); checking again once n3 has the log")
		c.voters(3)
		target := l.AppliedIndex()
		waitFor(t, 30*time.Second, func() bool { return n3.AppliedIndex() >= target })
		n3.sc.startupCheck()
	}
	if n3.sc.diverged.Load() == nil {
		t.Fatal("the check at start ended without finding that the server differs")
	}
	// Found by its own check at start, or by the leader's first check of
	// the term if that came first: either way out of service, saying why.
	if err := n3.ReadyErr(); err == nil || !strings.Contains(err.Error(), "differs from the cluster's") {
		t.Fatalf("readiness of the server that differs at start: %v", err)
	}
}

// metricValue reads a counter's or gauge's value.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("not a counter or gauge: %v", &m)
	return 0
}
