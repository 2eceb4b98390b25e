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
	others := e.Others(l)
	// Far longer than any bound: a stalled forward shows as a long
	// request, not as this client giving up.
	hc := &http.Client{Timeout: d + 15*time.Second}
	bound := api.DefaultForwardTimeout + probeSlack
	stop := make(chan struct{})
	var (
		mu        sync.Mutex
		ops       []probeOp
		wg        sync.WaitGroup
		pausedAt  time.Time
		electedAt time.Time
		newLeader = -1
	)
	probe := func(i, w int) {
		defer wg.Done()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			op := probeOp{node: i, write: (k+w)%2 == 0, start: time.Now()}
			var req *http.Request
			url := "http://" + e.C.HTTPAddr(i)
			if op.write {
				body := fmt.Sprintf(`{"key":"probe/%d/%d/%d","holder":"probe","ttl_ms":1000}`, i, w, k)
				req, _ = http.NewRequestWithContext(ctx, "POST", url+"/v1/leases", strings.NewReader(body))
			} else {
				req, _ = http.NewRequestWithContext(ctx, "GET", url+"/v1/leases?prefix=probe/&limit=1", nil)
			}
			resp, err := hc.Do(req)
			if err == nil {
				op.status = resp.StatusCode
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
	}
	watch := func() {
		defer wg.Done()
		for newLeader < 0 {
			for _, i := range others {
				st, err := e.Admin(i).Cluster(ctx)
				if err == nil && strings.EqualFold(st.State, "leader") {
					mu.Lock()
					newLeader, electedAt = i, time.Now()
					mu.Unlock()
					return
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	apply := func() error {
		if err := e.C.Pause(l); err != nil {
			return err
		}
		pausedAt = time.Now()
		for _, i := range others {
			for w := range 2 {
				wg.Add(1)
				go probe(i, w)
			}
		}
		wg.Add(1)
		go watch()
		return nil
	}
	undo := func() error {
		close(stop)
		return e.C.Resume(l)
	}
	err := e.Fault(ctx, "pause", fmt.Sprintf("leader %d for %v, probed", l, d), d, apply, undo)
	if pausedAt.IsZero() {
		return err // not paused: nothing was probed
	}
	wg.Wait() // every request ends within hc's timeout
	if err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	var bad []string
	var longest probeOp
	followerWrites := 0
	first := time.Duration(-1)
	for _, op := range ops {
		if op.took > longest.took {
			longest = op
		}
		switch {
		case op.err != nil:
			bad = append(bad, fmt.Sprintf("node %d (write %v, sent %v into the pause): no answer after %v: %v",
				op.node, op.write, op.start.Sub(pausedAt).Round(time.Millisecond), op.took.Round(time.Millisecond), op.err))
		case op.took > bound:
			bad = append(bad, fmt.Sprintf("node %d (write %v, sent %v into the pause): answered %d after %v, over %v",
				op.node, op.write, op.start.Sub(pausedAt).Round(time.Millisecond), op.status, op.took.Round(time.Millisecond), bound))
		case !op.write && op.status == http.StatusGatewayTimeout:
			bad = append(bad, fmt.Sprintf("node %d: a read answered 504 INDETERMINATE", op.node))
		}
		if newLeader >= 0 && op.node != newLeader && op.write && op.status == http.StatusCreated && !op.start.Before(electedAt) {
			followerWrites++
			if after := op.start.Add(op.took).Sub(electedAt); first < 0 || after < first {
				first = after
			}
		}
	}
	e.Count("follower-writes-after-election", followerWrites)
	detail := fmt.Sprintf("%d requests to the other nodes; longest %v (node %d, write %v, answer %d)",
		len(ops), longest.took.Round(time.Millisecond), longest.node, longest.write, longest.status)
	if newLeader >= 0 {
		detail += fmt.Sprintf("; node %d led %v into the pause", newLeader, electedAt.Sub(pausedAt).Round(time.Millisecond))
	}
	if first >= 0 {
		detail += fmt.Sprintf("; first write through a follower acknowledged %v after that", first.Round(time.Millisecond))
	}
	e.Note("probe", detail, nil)
	if len(bad) > 0 {
		sort.Strings(bad)
		if len(bad) > 5 {
			bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
		}
		return fmt.Errorf("requests to the nodes that were not paused stalled: %s", strings.Join(bad, "; "))
	}
	return nil
}
