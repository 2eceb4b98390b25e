package chaos

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api"
)

// probeSlack is what a probe request may take beyond the forward bound
// (api.DefaultForwardTimeout; no wait_ms) on a loaded machine.
const probeSlack = 3 * time.Second

// probeOp is one request a probe sent to a node that was not paused.
type probeOp struct {
	node   int
	write  bool
	start  time.Time
	took   time.Duration
	status int
	err    error
}

// pauseProbed SIGSTOPs node l for d while probes send acquires (no
// wait_ms) and linearizable reads to every other node. It fails (the run's
// nemesis verdict) when a request to them waited longer than the forward
// bound plus probeSlack, had no answer, or was a read answered
// INDETERMINATE; it counts "follower-writes-after-election", the writes
// through a node other than the new leader acknowledged after the
// election, and notes the figures in the history.
func (e *Env) pauseProbed(ctx context.Context, l int, d time.Duration) error {
	p := &pauseProbe{e: e, others: e.Others(l), stop: make(chan struct{}), newLeader: -1,
		// Far longer than any bound: a stalled forward shows as a long
		// request, not as this client giving up.
		hc: &http.Client{Timeout: d + 15*time.Second}}
	apply := func() error {
		if err := e.C.Pause(l); err != nil {
			return err
		}
		p.pausedAt = time.Now()
		for _, i := range p.others {
			for w := range 2 {
				p.wg.Add(1)
				go p.probe(ctx, i, w)
			}
		}
		p.wg.Add(1)
		go p.watch(ctx)
		return nil
	}
	undo := func() error {
		close(p.stop)
		return e.C.Resume(l)
	}
	err := e.Fault(ctx, "pause", fmt.Sprintf("leader %d for %v, probed", l, d), d, apply, undo)
	if p.pausedAt.IsZero() {
		return err // not paused: nothing was probed
	}
	p.wg.Wait() // every request ends within hc's timeout
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.judge(api.DefaultForwardTimeout + probeSlack)
}

// pauseProbe is the state of one pauseProbed: the probes and the watch for
// a new leader run from the pause until stop is closed.
type pauseProbe struct {
	e      *Env
	others []int // the nodes not paused
	hc     *http.Client
	stop   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	ops       []probeOp
	pausedAt  time.Time
	electedAt time.Time
	newLeader int // -1 until the watch sees one
}

// probe sends node i requests, one at a time, writes and reads in turn (w
// picks which comes first), until stop.
func (p *pauseProbe) probe(ctx context.Context, i, w int) {
	defer p.wg.Done()
	for k := 0; ; k++ {
		select {
		case <-p.stop:
			return
		default:
		}
		op := probeOp{node: i, write: (k+w)%2 == 0, start: time.Now()}
		var req *http.Request
		url := "http://" + p.e.C.HTTPAddr(i)
		if op.write {
			body := fmt.Sprintf(`{"key":"probe/%d/%d/%d","holder":"probe","ttl_ms":1000}`, i, w, k)
			req, _ = http.NewRequestWithContext(ctx, "POST", url+"/v1/leases", strings.NewReader(body))
		} else {
			req, _ = http.NewRequestWithContext(ctx, "GET", url+"/v1/leases?prefix=probe/&limit=1", nil)
		}
		resp, err := p.hc.Do(req)
		if err == nil {
			op.status = resp.StatusCode
			resp.Body.Close()
		}
		op.took, op.err = time.Since(op.start), err
		p.mu.Lock()
		p.ops = append(p.ops, op)
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// watch asks the other nodes until one says it leads (or stop).
func (p *pauseProbe) watch(ctx context.Context) {
	defer p.wg.Done()
	for p.newLeader < 0 {
		for _, i := range p.others {
			st, err := p.e.Admin(i).Cluster(ctx)
			if err == nil && strings.EqualFold(st.State, "leader") {
				p.mu.Lock()
				p.newLeader, p.electedAt = i, time.Now()
				p.mu.Unlock()
				return
			}
		}
		select {
		case <-p.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// judge counts and notes what the probes saw, and fails if a request
// stalled beyond bound, had no answer, or was a read answered
// INDETERMINATE.
func (p *pauseProbe) judge(bound time.Duration) error {
	var bad []string
	var longest probeOp
	followerWrites := 0
	first := time.Duration(-1)
	for _, op := range p.ops {
		if op.took > longest.took {
			longest = op
		}
		switch {
		case op.err != nil:
			bad = append(bad, fmt.Sprintf("node %d (write %v, sent %v into the pause): no answer after %v: %v",
				op.node, op.write, op.start.Sub(p.pausedAt).Round(time.Millisecond), op.took.Round(time.Millisecond), op.err))
		case op.took > bound:
			bad = append(bad, fmt.Sprintf("node %d (write %v, sent %v into the pause): answered %d after %v, over %v",
				op.node, op.write, op.start.Sub(p.pausedAt).Round(time.Millisecond), op.status, op.took.Round(time.Millisecond), bound))
		case !op.write && op.status == http.StatusGatewayTimeout:
			bad = append(bad, fmt.Sprintf("node %d: a read answered 504 INDETERMINATE", op.node))
		}
		if p.newLeader >= 0 && op.node != p.newLeader && op.write && op.status == http.StatusCreated && !op.start.Before(p.electedAt) {
			followerWrites++
			if after := op.start.Add(op.took).Sub(p.electedAt); first < 0 || after < first {
				first = after
			}
		}
	}
	p.e.Count("follower-writes-after-election", followerWrites)
	detail := fmt.Sprintf("%d requests to the other nodes; longest %v (node %d, write %v, answer %d)",
		len(p.ops), longest.took.Round(time.Millisecond), longest.node, longest.write, longest.status)
	if p.newLeader >= 0 {
		detail += fmt.Sprintf("; node %d led %v into the pause", p.newLeader, p.electedAt.Sub(p.pausedAt).Round(time.Millisecond))
	}
	if first >= 0 {
		detail += fmt.Sprintf("; first write through a follower acknowledged %v after that", first.Round(time.Millisecond))
	}
	p.e.Note("probe", detail, nil)
	if len(bad) > 0 {
		sort.Strings(bad)
		if len(bad) > 5 {
			bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
		}
		return fmt.Errorf("requests to the nodes that were not paused stalled: %s", strings.Join(bad, "; "))
	}
	return nil
}
