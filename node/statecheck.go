package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// The cross-server state check. Replicas that applied the same log must
// have the same state; a disk that rots under a store that checks nothing,
// or a bug of ours, can make one differ without a word. So:
//
//   - the leader, every Config.StateCheckInterval, asks every server of the
//     configuration (itself included) for the hash of its state right after
//     one coming log index (the same index for all: hashAt), over the Raft
//     port's node-to-node streams, and compares them. The hash a strict
//     majority of the configuration shares is the cluster's; a server whose
//     hash differs is told so, and takes itself out of service: ReadyErr
//     says why (so /readyz fails), the leasehold_state_diverged gauge is 1,
//     and its log says what to do (wipe its data directory and let it
//     rejoin). A leader that finds itself the odd one hands leadership on;
//   - a server that starts compares itself with the others the same way
//     before it reports ready (a server that was stopped while its disk
//     rotted would otherwise serve until the next periodic check).
//
// Cost: one capture of the state (pointers to copy-on-write records) per
// server per check, encoded and hashed off the apply path.

// stateCheckPath is the node-to-node route of a state hash; divergedPath
// is the one that tells a server it differs.
const (
	stateCheckPath = "/internal/node/state-hash"
	divergedPath   = "/internal/node/diverged"
)

type stateCheckMetrics struct {
	checks     *prometheus.CounterVec
	mismatches prometheus.Counter
	diverged   prometheus.Gauge
	duration   prometheus.Histogram
}

func newStateCheckMetrics(reg prometheus.Registerer) *stateCheckMetrics {
	m := &stateCheckMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leasehold_state_checks_total",
			Help: "Cross-server state checks this server ran as leader, by outcome (agree, mismatch, incomplete, split: hashes differ and no strict majority of the configuration shares one, so no server can be told it is the odd one)."}, []string{"outcome"}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "leasehold_state_check_mismatches_total",
			Help: "Servers found with a state that differs from the majority's, by the checks this server ran as leader."}),
		diverged: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leasehold_state_diverged",
			Help: "1 when a state check found this server's state different from the cluster's: it is out of service (wipe its data directory and let it rejoin)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leasehold_state_check_duration_seconds",
			Help: "How long a cross-server state check took, on the leader.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
	}
	for _, outcome := range []string{"agree", "mismatch", "incomplete", "split"} {
		m.checks.WithLabelValues(outcome) // exposed at 0: an alert's series exists before the first check
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.mismatches, m.diverged, m.duration)
	}
	return m
}

// stateCheck is the state check on one server.
type stateCheck struct {
	cfg      *Config
	log      *slog.Logger
	rep      *replica
	cl       *cluster.Cluster // set once Raft runs
	peerHTTP *http.Client     // set once Raft runs (nil: an in-memory node)
	closing  <-chan struct{}
	// diverged is set when a check found this server's state different
	// from the cluster's; startChecked once the check at start is over.
	diverged     atomic.Pointer[string]
	lastCheck    atomic.Int64 // when the last state check ran (since processStart)
	startChecked atomic.Bool
	metrics      *stateCheckMetrics
	// out is fired when the server finds itself diverged: running
	// subscriptions end (Gate).
	out *outSignal
	// steppingDown: a stepDownWhileLeading runs; stepDowns counts its
	// attempts (tests).
	steppingDown atomic.Bool
	stepDowns    atomic.Int64
}

// stateHashAnswer is a server's answer to a state hash request.
type stateHashAnswer struct {
	NodeID string `json:"node_id"`
	Index  uint64 `json:"index"`
	Tick   uint64 `json:"tick"`
	Sum    string `json:"sum"`
	Code   string `json:"code,omitempty"`
	Error  string `json:"error,omitempty"`
}

// divergedNotice tells a server that its state differs.
type divergedNotice struct {
	Index    uint64 `json:"index"`
	Sum      string `json:"sum"`
	Majority string `json:"majority"`
	By       string `json:"by"`
}

// internalHandler serves the node's own node-to-node routes.
func (sc *stateCheck) internalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+stateCheckPath, func(w http.ResponseWriter, r *http.Request) {
		at, err := strconv.ParseUint(r.URL.Query().Get("at"), 10, 64)
		if err != nil || at == 0 {
			http.Error(w, "at: a log index is required", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), sc.cfg.hashWait(at-min(at, sc.rep.applied.Load())))
		defer cancel()
		ans := stateHashAnswer{NodeID: sc.cfg.NodeID, Index: at}
		h, err := sc.rep.hashAt(ctx, at)
		status := http.StatusOK
		if err != nil {
			status = http.StatusConflict
			ans.Code, ans.Error = string(wire.ErrorCode(err)), err.Error()
		} else {
			ans.Tick, ans.Sum = h.tick, h.sum
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(ans)
	})
	mux.HandleFunc("POST "+divergedPath, func(w http.ResponseWriter, r *http.Request) {
		var d divergedNotice
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&d); err != nil {
			http.Error(w, "bad notice", http.StatusBadRequest)
			return
		}
		sc.markDiverged(d)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// outOfService says why this server must not serve or lead, if it must not:
// a state check found its state different from the cluster's, or its log
// holds an entry it cannot apply.
func (sc *stateCheck) outOfService() error {
	if msg := sc.rep.broken.Load(); msg != nil {
		return errOutOfService(ServiceDamaged, *msg)
	}
	if msg := sc.diverged.Load(); msg != nil {
		return errOutOfService(ServiceDiverged, *msg)
	}
	return nil
}

// markDiverged takes this server out of service: its state differs from
// the cluster's.
func (sc *stateCheck) markDiverged(d divergedNotice) {
	if canaryNoGuard {
		return
	}
	msg := fmt.Sprintf("this server's state differs from the cluster's at log index %d (hash %.16s, the majority's %.16s; found by %s): "+
		"it is out of service; wipe its data directory and let it rejoin", d.Index, d.Sum, d.Majority, d.By)
	if sc.diverged.Swap(&msg) == nil {
		sc.log.Error("state check: " + msg)
	}
	sc.metrics.diverged.Set(1)
	sc.out.fire()
	if sc.cl.IsLeader() {
		go sc.stepDownWhileLeading(context.Background()) // lt.run refuses it from now on
	}
}

// stepDownWhileLeading hands leadership on, again and again, until this
// server no longer leads (or ctx ends, or the node closes): a server out
// of service must not lead, and one transfer can fail (no voter reachable,
// none caught up). Meanwhile Gate refuses every write and read. One runs
// at a time.
func (sc *stateCheck) stepDownWhileLeading(ctx context.Context) {
	if !sc.steppingDown.CompareAndSwap(false, true) {
		return
	}
	defer sc.steppingDown.Store(false)
	for try := 0; sc.cl.IsLeader() && ctx.Err() == nil; try++ {
		select {
		case <-sc.closing:
			return
		default:
		}
		if try%10 == 0 {
			sc.log.Error("out of service and still the leader: handing leadership on", "attempt", try+1)
		}
		sc.stepDowns.Add(1)
		sc.cl.StepDown(ctx)
		if sleepCtx(ctx, backoff(try)) != nil {
			return
		}
	}
}

// peerHashAt asks the server at raft address addr for its state hash at at.
func (sc *stateCheck) peerHashAt(ctx context.Context, addr string, at uint64) (stateHashAnswer, error) {
	var ans stateHashAnswer
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+stateCheckPath+"?at="+strconv.FormatUint(at, 10), nil)
	if err != nil {
		return ans, err
	}
	resp, err := sc.peerHTTP.Do(req)
	if err != nil {
		return ans, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return ans, errNoStateCheck
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&ans); err != nil {
		return ans, fmt.Errorf("state hash of %s: %s", addr, resp.Status)
	}
	if ans.Code != "" {
		return ans, &wire.Error{Code: wire.Code(ans.Code), Message: ans.Error}
	}
	return ans, nil
}

// errNoStateCheck: the server runs a version without the state check.
var errNoStateCheck = errors.New("the server does not answer state checks (an earlier version)")

// hashOn returns the state hash at at of the server id at raft address
// addr (this one's own when id is this server's).
func (sc *stateCheck) hashOn(ctx context.Context, id, addr string, at uint64) (string, error) {
	if id == sc.cfg.NodeID {
		h, err := sc.rep.hashAt(ctx, at)
		if err != nil {
			return "", err
		}
		return h.sum, nil
	}
	if h := sc.cfg.peerHashHook; h != nil {
		return h(ctx, id, at)
	}
	ans, err := sc.peerHashAt(ctx, addr, at)
	return ans.Sum, err
}

// canCheck reports whether this server can reach the others' state
// hashes (not an in-memory node, unless a test stands in).
func (sc *stateCheck) canCheck() bool {
	return sc.cfg.StateCheckInterval > 0 && (sc.peerHTTP != nil || sc.cfg.peerHashHook != nil)
}

// stateCheckLoop runs the periodic check while this server leads (ctx).
func (sc *stateCheck) stateCheckLoop(ctx context.Context) {
	every := sc.cfg.StateCheckInterval
	if !sc.canCheck() {
		return
	}
	// The first check of a term comes when the last one (of any term) is
	// due again, or soon: terms shorter than the interval must not skip it.
	first := every
	if last := sc.lastCheck.Load(); last == 0 {
		first = min(every, 10*time.Second)
	} else if since := time.Since(processStart) - time.Duration(last); since >= every {
		first = min(every, 10*time.Second)
	} else {
		first = every - since
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sc.closing:
			return
		case <-t.C:
		}
		sc.checkStates(ctx)
		sc.lastCheck.Store(int64(time.Since(processStart)))
		t.Reset(every)
	}
}

// stateCheckResult is what one check found.
type stateCheckResult struct {
	index    uint64
	sums     map[string]string // server id -> hash, for those that answered
	majority string            // "" when no strict majority agrees
	odd      []string
}

// checkStates runs one check: every server's hash at one coming index;
// a server whose hash is not the majority's is told so.
func (sc *stateCheck) checkStates(ctx context.Context) *stateCheckResult {
	start := time.Now()
	conf, err := sc.cl.Configuration()
	if err != nil {
		return nil
	}
	servers := conf.Servers
	if len(servers) < 2 {
		return nil
	}
	res := sc.collectHashes(ctx, servers)
	sc.metrics.duration.Observe(time.Since(start).Seconds())
	switch distinct := len(uniqueSums(res.sums)); {
	case res.majority == "" && distinct > 1:
		// Two survivors disagree while the third is down, say: which one
		// is right cannot be told, and nobody is taken out of service.
		// An operator must look (LeaseholdStateCheckSplit).
		sc.metrics.checks.WithLabelValues("split").Inc()
		sc.log.Error("state check: the servers' states differ and no majority of the configuration shares one; "+
			"nobody can be told it is the odd one: compare the servers (GET /v1/cluster/local?hash_at=N) and replace the wrong one",
			"index", res.index, "hashes", res.sums, "servers", len(servers))
		return res
	case res.majority == "":
		sc.metrics.checks.WithLabelValues("incomplete").Inc()
		return res
	case distinct == 1:
		sc.metrics.checks.WithLabelValues("agree").Inc()
		return res
	}
	sc.metrics.checks.WithLabelValues("mismatch").Inc()
	for _, s := range servers {
		id := string(s.ID)
		sum, ok := res.sums[id]
		if !ok || sum == res.majority {
			continue
		}
		res.odd = append(res.odd, id)
		sc.metrics.mismatches.Inc()
		sc.log.Error("state check: a server's state differs from the majority's; it takes itself out of service "+
			"(wipe its data directory and let it rejoin)", "server", id, "index", res.index, "hash", sum, "majority", res.majority)
		d := divergedNotice{Index: res.index, Sum: sum, Majority: res.majority, By: sc.cfg.NodeID}
		switch {
		case id == sc.cfg.NodeID:
			sc.markDiverged(d) // and hands leadership on until it no longer leads
		case sc.cfg.divergedHook != nil:
			sc.cfg.divergedHook(id, d)
		default:
			sc.sendDiverged(ctx, string(s.Address), d)
		}
	}
	return res
}

// collectHashes asks every server for its state hash at one coming index
// (further ahead when one had passed it already) and finds the hash a
// strict majority of them shares, if any.
func (sc *stateCheck) collectHashes(ctx context.Context, servers []cluster.Server) *stateCheckResult {
	res := &stateCheckResult{}
	for lead := uint64(8); lead <= 1024 && ctx.Err() == nil; lead *= 2 {
		res.index = sc.cl.CommitIndex() + lead
		res.sums = make(map[string]string, len(servers))
		passed := false
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Go(func() {
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second+sc.cfg.hashWait(lead))
				defer cancel()
				sum, err := sc.hashOn(hctx, s.ID, s.Address, res.index)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					res.sums[s.ID] = sum
				case wire.ErrorCode(err) == wire.CodeIndexPassed:
					passed = true
				}
			})
		}
		wg.Wait()
		if !passed {
			break
		}
	}
	for sum, c := range uniqueSums(res.sums) {
		if c > len(servers)/2 {
			res.majority = sum
		}
	}
	return res
}

// uniqueSums counts the servers of each hash.
func uniqueSums(sums map[string]string) map[string]int {
	count := map[string]int{}
	for _, sum := range sums {
		count[sum]++
	}
	return count
}

// sendDiverged tells the server at raft address addr that it differs.
func (sc *stateCheck) sendDiverged(ctx context.Context, addr string, d divergedNotice) {
	b, _ := json.Marshal(d)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+divergedPath, bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := sc.peerHTTP.Do(req)
	if err != nil {
		sc.log.Warn("state check: could not tell a diverged server", "addr", addr, "err", err)
		return
	}
	resp.Body.Close()
}

// startupCheck compares this server's state with the others' once, when
// it starts (the hash a strict majority of the configuration shares at one
// coming index, as the periodic check does); it reports ready only after
// (startChecked). Without a majority's answer in startupCheckFor (servers
// of an earlier version, or gone) it ends without a verdict.
func (sc *stateCheck) startupCheck() {
	defer sc.startChecked.Store(true)
	if !sc.canCheck() {
		return
	}
	checkFor := max(startupCheckFor, 2*sc.cfg.hashWait(8))
	deadline := time.Now().Add(checkFor)
	for time.Now().Before(deadline) {
		select {
		case <-sc.closing:
			return
		case <-time.After(100 * time.Millisecond):
		}
		addr, id := sc.cl.Leader()
		if addr == "" || sc.rep.applied.Load() < sc.cl.CommitIndex() {
			continue
		}
		conf, err := sc.cl.Configuration()
		if err != nil {
			continue
		}
		servers := conf.Servers
		if len(servers) < 2 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+sc.cfg.hashWait(8))
		res := sc.collectHashes(ctx, servers)
		cancel()
		mine, ok := res.sums[sc.cfg.NodeID]
		switch {
		case !ok || res.majority == "":
			continue // an index passed, a timeout, or no majority answered yet: again
		case mine != res.majority:
			// A majority of the configuration, not the leader alone: a
			// leader whose own state rotted must not take every server
			// that restarts out of service.
			sc.markDiverged(divergedNotice{Index: res.index, Sum: mine, Majority: res.majority,
				By: sc.cfg.NodeID + " (a majority of the servers, at this server's start)"})
			return
		default:
			if lsum, ok := res.sums[string(id)]; ok && lsum != res.majority && string(id) != sc.cfg.NodeID {
				d := divergedNotice{Index: res.index, Sum: lsum, Majority: res.majority, By: sc.cfg.NodeID + " (at its start)"}
				if h := sc.cfg.divergedHook; h != nil {
					h(string(id), d)
				} else {
					sc.sendDiverged(context.Background(), string(addr), d)
				}
			}
			sc.log.Info("state check at start: this server's state is the majority's", "index", res.index)
			return
		}
	}
	sc.log.Warn("state check at start: no majority answered in time; skipped", "for", checkFor)
}

// startupCheckFor bounds the check at start (longer with slow ticks:
// hashWait).
const startupCheckFor = 30 * time.Second

// hashWait bounds the wait for a state hash at an index ahead entries
// past the applied index. An idle cluster's log grows by about one entry
// (a tick) per tick period, so the bound grows with the period. At most
// hashWaitAhead entries count.
func (c *Config) hashWait(ahead uint64) time.Duration {
	return 10*time.Second + time.Duration(min(ahead, hashWaitAhead))*2*c.TickPeriod
}

const hashWaitAhead = 16
