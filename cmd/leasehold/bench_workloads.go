package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// benchWorker is one client's share of a workload.
type benchWorker struct {
	id       int
	ops      int64
	requests int64
	lat      []time.Duration
	acqLat   []time.Duration
	errs     map[string]int64
	// leases held across the measured phase (renew, heartbeat).
	leases []wire.HeartbeatItem
	// conn is the worker's way to the server for cycle, contended, renew,
	// session and fill: its own connection, or the shared Go client (--via).
	conn benchOps
	// session is the worker's session (id and token) in the session workload.
	session wire.HeartbeatItem
	// stream is the keep-alive stream the worker shares (keepalive).
	stream *client.RenewStream
}

func (w *benchWorker) fail(err error) {
	code := cmp.Or(string(client.ErrorCode(err)), "transport")
	w.errs[code]++
}

// benchRun is the shared state of one workload's measured phase.
type benchRun struct {
	cfg   benchConfig
	c     *client.Client
	end   time.Time    // no operation counts after this
	total atomic.Int64 // operations started, against maxOps
}

// next reports whether a worker may start another operation, pacing it when
// a rate is set. k is the worker's count of operations so far.
func (r *benchRun) next(ctx context.Context, start time.Time, k int64) bool {
	if ctx.Err() != nil || !time.Now().Before(r.end) || r.total.Add(1) > r.cfg.maxOps {
		return false
	}
	if r.cfg.rate > 0 {
		per := time.Duration(float64(r.cfg.clients) / r.cfg.rate * float64(time.Second))
		if d := time.Until(start.Add(time.Duration(k) * per)); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-t.C:
			}
		}
	}
	return time.Now().Before(r.end)
}

// startOf is when a worker's paced schedule begins: with a rate set, the
// workers' schedules are spread evenly over one period, so that the load
// arrives steadily instead of in bursts of every client at once.
func (r *benchRun) startOf(w *benchWorker) time.Time {
	now := time.Now()
	if r.cfg.rate <= 0 {
		return now
	}
	per := time.Duration(float64(r.cfg.clients) / r.cfg.rate * float64(time.Second))
	return now.Add(per * time.Duration(w.id) / time.Duration(r.cfg.clients))
}

// counts reports whether an operation that finished at done is measured.
func (r *benchRun) counts(done time.Time) bool { return done.Before(r.end) }

// runWorkload runs one workload against c's servers: its setup, its measured
// phase (every worker concurrently for cfg.duration or cfg.maxOps) and its
// cleanup.
func runWorkload(ctx context.Context, c *client.Client, workload string, cfg benchConfig) (*benchResult, error) {
	// name is the operation: half-load is the cycle at a set rate.
	name := workload
	if workload == "half-load" {
		name = "cycle"
	}
	workers, err := newBenchWorkers(ctx, c, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, w := range workers {
			w.conn.close()
		}
	}()
	if cfg.grant {
		if err := waitGrantKeys(ctx, c); err != nil {
			return nil, err
		}
	}
	run := &benchRun{cfg: cfg, c: c}
	holder := func(w *benchWorker) string { return fmt.Sprintf("bench-%s-%d", cfg.runID, w.id) }
	key := func(parts ...any) string {
		k := cfg.prefix + workload
		for _, p := range parts {
			k += "/" + fmt.Sprint(p)
		}
		return k
	}

	// Setup: the leases that renew and heartbeat keep alive.
	if perWorker, setupTTL := benchSetupPlan(name, cfg); perWorker > 0 {
		err := setupLeases(ctx, c, workers, name, perWorker, setupTTL, holder, key)
		defer cleanupLeases(ctx, c, workers)
		if err != nil {
			return nil, err
		}
	}

	if name == "keepalive" {
		closeStreams, err := openStreams(ctx, c, workers, max(cfg.perStream, 1))
		if err != nil {
			return nil, err
		}
		defer closeStreams()
	}

	first := commitIndex(ctx, c)
	start := time.Now()
	run.end = start.Add(cfg.duration)
	_ = forEachWorker(workers, func(w *benchWorker) error {
		runBenchWorker(ctx, run, w, name, holder(w), key)
		return nil
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	elapsed := min(time.Since(start), cfg.duration)
	res := benchResultOf(workload, name, cfg, workers, elapsed)
	if last := commitIndex(ctx, c); first > 0 && last > first && res.Ops > 0 {
		res.EntriesPerOp = float64(last-first) / float64(res.Ops)
	}
	return res, nil
}

// commitIndex is the cluster's commit index as the leader reports it, 0
// when it cannot be read (the bench goes on without it).
func commitIndex(ctx context.Context, c *client.Client) uint64 {
	st, err := c.Cluster(ctx)
	if err != nil {
		return 0
	}
	return st.CommitIndex
}

// newBenchWorkers makes cfg.clients workers, each with its own connection to
// one of c's servers in turn, or (--via client) all sharing one Go client
// with its default options, as a Go program would make it.
func newBenchWorkers(ctx context.Context, c *client.Client, cfg benchConfig) ([]*benchWorker, error) {
	if cfg.via == viaClient {
		gc, err := client.New(c.Addrs(), client.Options{Token: cfg.token, Timeout: cfg.timeout, TLSConfig: cfg.tls})
		if err != nil {
			return nil, err
		}
		workers := make([]*benchWorker, cfg.clients)
		for i := range workers {
			workers[i] = &benchWorker{id: i, errs: map[string]int64{}, conn: &clientOps{ctx: ctx, c: gc, grant: cfg.grant}}
		}
		return workers, nil
	}
	var hosts []string
	var tlsConfs []*tls.Config
	for _, base := range c.Addrs() {
		u, err := url.Parse(base)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Path != "" {
			return nil, fmt.Errorf("bench needs http(s)://host:port addresses, got %q", base)
		}
		var tc *tls.Config
		if u.Scheme == "https" {
			tc = cfg.tls
			if tc == nil {
				tc = api.ClientTLS(nil, nil)
			}
		}
		hosts, tlsConfs = append(hosts, u.Host), append(tlsConfs, tc)
	}
	workers := make([]*benchWorker, cfg.clients)
	for i := range workers {
		bc := newBenchConn(hosts[i%len(hosts)], cfg.token, cmp.Or(cfg.timeout, 30*time.Second), tlsConfs[i%len(hosts)])
		bc.grant = cfg.grant
		workers[i] = &benchWorker{id: i, errs: map[string]int64{}, conn: bc}
	}
	return workers, nil
}

// benchSetupPlan is how many leases each worker of the operation name
// acquires before the measured phase (0: none), and with what TTL.
func benchSetupPlan(name string, cfg benchConfig) (perWorker int, ttl time.Duration) {
	switch name {
	case "renew", "keepalive":
		return 1, cfg.ttl
	case "heartbeat", "session":
		// The first leases must outlive the setup of all the others.
		return cfg.batch, max(cfg.ttl, benchSetupTimeout)
	}
	return 0, cfg.ttl
}

// setupLeases acquires perWorker leases for every worker (in the session
// workload, bound to a session each worker creates).
func setupLeases(ctx context.Context, c *client.Client, workers []*benchWorker, name string, perWorker int, setupTTL time.Duration,
	holder func(*benchWorker) string, key func(...any) string) error {
	sctx, cancel := context.WithTimeout(ctx, benchSetupTimeout)
	defer cancel()
	return forEachWorker(workers, func(w *benchWorker) error {
		req := wire.AcquireRequest{Holder: holder(w), TTLMS: millis(setupTTL)}
		if name == "session" {
			s, err := c.CreateSession(sctx, wire.SessionRequest{Holder: holder(w), TTLMS: millis(setupTTL)})
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			w.session = wire.HeartbeatItem{LeaseID: s.SessionID, Token: s.Token}
			req = wire.AcquireRequest{SessionID: s.SessionID, SessionToken: s.Token}
		}
		for j := range perWorker {
			req.Key = key(w.id, j)
			l, err := c.Acquire(sctx, req)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			w.leases = append(w.leases, wire.HeartbeatItem{LeaseID: l.LeaseID, Token: l.Token})
		}
		return nil
	})
}

// runBenchWorker runs one worker's share of the operation name's measured
// phase.
func runBenchWorker(ctx context.Context, run *benchRun, w *benchWorker, name, holder string, key func(...any) string) {
	switch name {
	case "cycle":
		benchCycle(ctx, run, w, holder, func(n int64) string { return key(w.id, n) })
	case "contended":
		benchContended(ctx, run, w, holder, key("one"))
	case "renew":
		benchRenew(ctx, run, w)
	case "keepalive":
		benchKeepAlive(ctx, run, w)
	case "heartbeat":
		benchHeartbeat(ctx, run, w)
	case "session":
		benchSession(ctx, run, w)
	case fillWorkload:
		benchFill(ctx, run, w, holder, func(n int64) string { return key(w.id, n) })
	}
}

// benchResultOf sums up the workers' counts and latencies.
func benchResultOf(workload, name string, cfg benchConfig, workers []*benchWorker, elapsed time.Duration) *benchResult {
	res := &benchResult{Workload: workload, Clients: cfg.clients, Seconds: elapsed.Seconds(), ErrorCodes: map[string]int64{}}
	res.Unit = map[string]string{"cycle": "cycles", "contended": "grants", "renew": "renewals", "keepalive": "renewals", "heartbeat": "leases kept alive", "session": "leases kept alive", fillWorkload: "leases"}[name]
	var lat, acq []time.Duration
	for _, w := range workers {
		res.Ops += w.ops
		res.Requests += w.requests
		lat = append(lat, w.lat...)
		acq = append(acq, w.acqLat...)
		for code, n := range w.errs {
			res.ErrorCodes[code] += n
			res.Errors += n
		}
	}
	if elapsed > 0 {
		res.OpsPerSec = float64(res.Ops) / elapsed.Seconds()
	}
	res.Latency = summarize(lat)
	if name == "cycle" {
		s := summarize(acq)
		res.AcquireLatency = &s
	}
	if len(res.ErrorCodes) == 0 {
		res.ErrorCodes = nil
	}
	return res
}

// forEachWorker runs f for every worker concurrently and returns the first
// worker's error, if any, and how many failed.
func forEachWorker(workers []*benchWorker, f func(*benchWorker) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(workers))
	for i, w := range workers {
		wg.Go(func() { errs[i] = f(w) })
	}
	wg.Wait()
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 1 {
		return fmt.Errorf("%w (and %d more clients failed)", first, failed-1)
	}
	return first
}

// pause backs a worker off briefly after a failure, so that a node that is
// down is not hammered in a tight loop.
func pause(ctx context.Context) {
	t := time.NewTimer(10 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func benchCycle(ctx context.Context, r *benchRun, w *benchWorker, holder string, key func(int64) string) {
	start := r.startOf(w)
	for n := int64(0); r.next(ctx, start, n); n++ {
		t0 := time.Now()
		id, tok, err := w.conn.acquire(key(n), holder, millis(r.cfg.ttl), 0)
		t1 := time.Now()
		if err != nil {
			if r.counts(t1) {
				w.requests++
				w.fail(err)
			}
			pause(ctx)
			continue
		}
		err = w.conn.release(id, tok)
		t2 := time.Now()
		if !r.counts(t2) {
			continue
		}
		w.requests += 2
		w.acqLat = append(w.acqLat, t1.Sub(t0))
		if err != nil {
			w.fail(err)
			continue
		}
		w.ops++
		w.lat = append(w.lat, t2.Sub(t0))
	}
}

// benchFill acquires leases on distinct keys and keeps none of them: they
// stay live until their TTL.
func benchFill(ctx context.Context, r *benchRun, w *benchWorker, holder string, key func(int64) string) {
	benchLoop(ctx, r, w, func(n int64) (int64, error) {
		_, _, err := w.conn.acquire(key(n), holder, millis(r.cfg.ttl), 0)
		return 1, err
	})
}

func benchContended(ctx context.Context, r *benchRun, w *benchWorker, holder, key string) {
	start := r.startOf(w)
	for n := int64(0); r.next(ctx, start, n); n++ {
		t0 := time.Now()
		id, tok, err := w.conn.acquire(key, holder, millis(r.cfg.ttl), 30_000)
		t1 := time.Now()
		if err == nil {
			// Release even after the end, so that the others' waits end.
			if rerr := w.conn.release(id, tok); rerr != nil && r.counts(t1) {
				w.fail(rerr)
			}
		}
		if !r.counts(t1) {
			continue
		}
		w.requests++
		if err != nil {
			w.fail(err)
			pause(ctx)
			continue
		}
		w.ops++
		w.lat = append(w.lat, t1.Sub(t0))
	}
}

func benchRenew(ctx context.Context, r *benchRun, w *benchWorker) {
	l := w.leases[0]
	benchLoop(ctx, r, w, func(int64) (int64, error) { return 1, w.conn.renew(l.LeaseID, l.Token) })
}

// openStreams opens one keep-alive stream per perStream workers; close
// closes them all.
func openStreams(ctx context.Context, c *client.Client, workers []*benchWorker, perStream int) (closeAll func(), err error) {
	var streams []*client.RenewStream
	closeAll = func() {
		for _, s := range streams {
			_ = s.Close()
		}
	}
	for i, w := range workers {
		if i%perStream == 0 {
			sctx, cancel := context.WithTimeout(ctx, benchSetupTimeout)
			s, err := c.KeepAliveStream(sctx)
			cancel()
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("setup: open a keep-alive stream: %w", err)
			}
			streams = append(streams, s)
		}
		w.stream = streams[len(streams)-1]
	}
	return closeAll, nil
}

// benchKeepAlive renews the worker's lease, one renewal at a time, over the
// keep-alive stream it shares.
func benchKeepAlive(ctx context.Context, r *benchRun, w *benchWorker) {
	l := w.leases[0]
	benchLoop(ctx, r, w, func(int64) (int64, error) {
		_, err := w.stream.Renew(ctx, l.LeaseID, l.Token, 0)
		return 1, err
	})
}

// benchLoop runs op (given its sequence number) until the workload ends,
// counting the units of work each successful op reports.
func benchLoop(ctx context.Context, r *benchRun, w *benchWorker, op func(n int64) (int64, error)) {
	start := r.startOf(w)
	for n := int64(0); r.next(ctx, start, n); n++ {
		t0 := time.Now()
		units, err := op(n)
		t1 := time.Now()
		if !r.counts(t1) {
			continue
		}
		w.requests++
		if err != nil {
			w.fail(err)
			pause(ctx)
			continue
		}
		w.ops += units
		w.lat = append(w.lat, t1.Sub(t0))
	}
}

// heartbeatChunks splits items into requests whose JSON bodies stay under
// the body limit.
func heartbeatChunks(items []wire.HeartbeatItem) [][]wire.HeartbeatItem {
	if len(items) == 0 {
		return nil
	}
	// {"lease_id":"…","token":"…"}, plus the envelope {"leases":[…]}.
	per := len(items[0].LeaseID) + len(items[0].Token) + len(`{"lease_id":"","token":""},`) + 8 // slack for longer ids
	n := max((maxBodyBytes-64)/per, 1)
	var out [][]wire.HeartbeatItem
	for len(items) > n {
		out = append(out, items[:n:n])
		items = items[n:]
	}
	return append(out, items)
}

func benchHeartbeat(ctx context.Context, r *benchRun, w *benchWorker) {
	chunks := heartbeatChunks(w.leases)
	benchLoop(ctx, r, w, func(n int64) (int64, error) {
		res, err := r.c.Heartbeat(ctx, chunks[int(n)%len(chunks)])
		if err != nil {
			return 0, err
		}
		var ok int64
		for _, x := range res {
			if x.OK {
				ok++
			} else if x.Error != nil {
				w.errs[string(x.Error.Code)]++
			}
		}
		return ok, nil
	})
}

// cleanupLeases releases the leases the setup acquired; what it cannot
// release in time expires by itself.
func cleanupLeases(ctx context.Context, c *client.Client, workers []*benchWorker) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchSetupTimeout)
	defer cancel()
	_ = forEachWorker(workers, func(w *benchWorker) error {
		if w.session.LeaseID != "" {
			// Ending the session releases every lease bound to it.
			_, _ = c.EndSession(cctx, w.session.LeaseID, w.session.Token)
			return nil
		}
		for _, l := range w.leases {
			if cctx.Err() != nil {
				return nil
			}
			_, _ = c.Release(cctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token, Reason: "bench done"})
		}
		return nil
	})
}

// benchSession heartbeats one session with --batch leases bound to it: each
// heartbeat keeps all of them alive with one log write.
func benchSession(ctx context.Context, r *benchRun, w *benchWorker) {
	benchLoop(ctx, r, w, func(int64) (int64, error) {
		return int64(len(w.leases)), w.conn.sessionHeartbeat(w.session.LeaseID, w.session.Token)
	})
}
