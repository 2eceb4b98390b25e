package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
)

var benchWorkloads = []string{"cycle", "half-load", "contended", "renew", "keepalive", "heartbeat", "session"}

// fillWorkload is not part of "all": it leaves its leases behind (until
// their TTL), to measure a server holding many (make bench-scale-server).
const fillWorkload = "fill"

type benchConfig struct {
	clients  int
	duration time.Duration
	batch    int
	ttl      time.Duration
	maxOps   int64
	rate     float64 // operations per second over all clients; 0: as fast as possible
	// perStream is how many clients share one keep-alive stream.
	perStream int
	prefix    string
	runID     string
	// token and timeout configure the bench's own connections.
	token   string
	timeout time.Duration
	// tls, if set, is the client TLS configuration (https addresses).
	tls *tls.Config
}

// benchSetupTimeout bounds a workload's setup (acquiring the leases that
// renew and heartbeat then keep alive) and its cleanup.
const benchSetupTimeout = 2 * time.Minute

// maxBodyBytes is the contract's request body limit; bulk heartbeats are
// split to stay under it.
const maxBodyBytes = 64 << 10

func (a *app) benchCmd(ctx context.Context, args []string) error {
	relaxGC()
	fs := a.newFlagSet("bench", "", "Drive a running node over HTTP with concurrent clients and report throughput and latency.\n"+
		"Workloads: cycle (acquire + release on distinct keys), contended (every client acquires one key,\n"+
		"waiting, then releases), renew (single-lease renewals), keepalive (single-lease renewals over\n"+
		"keep-alive streams, --stream-clients clients per stream), heartbeat (bulk heartbeats; counts leases\n"+
		"kept alive), session (heartbeats of a session with --batch bound leases; counts leases kept alive),\n"+
		"half-load (cycle paced at half the rate the cycle workload just reached: latency below saturation),\n"+
		"all (each in turn; not fill). fill acquires leases on distinct keys and leaves them to their TTL\n"+
		"(a server holding --max-ops live leases). Each workload runs for --duration or --max-ops, whichever ends first.\n"+
		"--spawn 1,3 starts throwaway clusters of this binary on loopback (one server, then three) and benches\n"+
		"each one's leader in turn, instead of --addr.")
	var cf clientFlags
	cf.register(fs)
	cfg := benchConfig{runID: randomID(4)}
	workload := fs.String("workload", "all", "comma-separated: cycle, half-load, contended, renew, keepalive, heartbeat, session, all, or fill")
	spawn := fs.String("spawn", "", "comma-separated cluster sizes (1-7) to start on loopback and bench in turn, e.g. 1,3 (instead of --addr)")
	serverBin := fs.String("server-bin", "", "with --spawn: the leasehold binary to run the servers (default: this one), to compare versions with one load generator")
	fs.IntVar(&cfg.clients, "clients", 64, "concurrent clients")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time per workload")
	fs.IntVar(&cfg.perStream, "stream-clients", 8, "clients sharing one keep-alive stream (keepalive)")
	fs.IntVar(&cfg.batch, "batch", 1000, "leases each client keeps alive per heartbeat round (split into requests under 64 KiB)")
	fs.DurationVar(&cfg.ttl, "ttl", 30*time.Second, "TTL of the leases the bench acquires")
	fs.Int64Var(&cfg.maxOps, "max-ops", 10_000_000, "stop a workload after this many operations")
	fs.Float64Var(&cfg.rate, "rate", 0, "target operations per second over all clients (0: unlimited)")
	fs.StringVar(&cfg.prefix, "prefix", "", "key prefix (default bench/<random>/)")
	pos, err := a.parse(fs, args, clientEnv(), 0)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("bench takes no arguments")
	}
	var workloads []string
	for _, w := range splitList(*workload) {
		switch {
		case w == "all":
			workloads = append(workloads, benchWorkloads...)
		case slices.Contains(benchWorkloads, w) || w == fillWorkload:
			workloads = append(workloads, w)
		default:
			return usageErrorf("--workload %q: want %s, all or fill", w, strings.Join(benchWorkloads, ", "))
		}
	}
	if len(workloads) == 0 {
		return usageErrorf("--workload: name at least one")
	}
	sizes, err := parseSpawn(*spawn)
	if err != nil {
		return err
	}
	if len(sizes) > 0 {
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "addr" })
		if explicit {
			return usageErrorf("--spawn benches servers it starts itself: drop --addr")
		}
	}
	switch {
	case cfg.clients < 1 || cfg.clients > 10000:
		return usageErrorf("--clients must be 1-10000")
	case cfg.duration <= 0 || cfg.duration > time.Hour:
		return usageErrorf("--duration must be positive and at most 1h")
	case cfg.perStream < 1:
		return usageErrorf("--stream-clients must be positive")
	case cfg.batch < 1 || cfg.batch > 100000:
		return usageErrorf("--batch must be 1-100000")
	case cfg.maxOps < 1:
		return usageErrorf("--max-ops must be positive")
	case cfg.rate < 0:
		return usageErrorf("--rate must not be negative")
	}
	if cfg.prefix == "" {
		cfg.prefix = "bench/" + cfg.runID + "/"
	}
	cfg.token, cfg.timeout = cf.token, cf.timeout
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 2 * cfg.clients
	t.MaxIdleConnsPerHost = cfg.clients
	t.DisableCompression = true
	t.ForceAttemptHTTP2 = false
	if cfg.tls, err = cf.tls.config(); err != nil {
		return err
	}
	t.TLSClientConfig = cfg.tls
	defer t.CloseIdleConnections()
	newClient := func(addrs []string) (*client.Client, error) {
		return client.New(addrs, client.Options{Token: cf.token, Timeout: cf.timeout,
			HTTPClient: &http.Client{Transport: t}, TLSConfig: cfg.tls})
	}
	var results []*benchResult
	runAll := func(c *client.Client, servers int) error {
		var peak float64 // the cycle workload's rate in this run
		for _, w := range workloads {
			wcfg := cfg
			if w == "half-load" {
				if peak == 0 {
					return usageErrorf("--workload half-load runs after cycle (it paces itself at half the cycle's rate)")
				}
				wcfg.rate = peak / 2
			}
			if !cf.json {
				fmt.Fprintf(a.stderr, "bench: %s, %d clients, %s...\n", w, cfg.clients, cfg.duration)
			}
			r, err := runWorkload(ctx, c, w, wcfg)
			if err != nil {
				return fmt.Errorf("%s: %w", w, err)
			}
			if w == "cycle" {
				peak = r.OpsPerSec
			}
			r.Servers = servers
			results = append(results, r)
		}
		return nil
	}
	if len(sizes) == 0 {
		c, err := newClient(splitList(cf.addr))
		if err != nil {
			return usageErrorf("--addr: %v", err)
		}
		if err := runAll(c, 0); err != nil {
			return err
		}
	}
	for _, n := range sizes {
		if !cf.json {
			fmt.Fprintf(a.stderr, "bench: starting %d server(s) on loopback...\n", n)
		}
		sc, err := spawnCluster(ctx, n, *serverBin, nil)
		if err != nil {
			return err
		}
		c, err := newClient([]string{sc.leader})
		if err == nil {
			err = runAll(c, n)
		}
		sc.stop()
		if err != nil {
			return err
		}
	}
	if cf.json {
		err = writeJSON(a.stdout, results)
	} else {
		err = printBench(a.stdout, results)
	}
	if err != nil {
		return err
	}
	for _, r := range results {
		if r.Ops == 0 && r.Errors > 0 {
			return fmt.Errorf("%s: every operation failed", r.Workload)
		}
	}
	return nil
}

// benchResult is the outcome of one workload.
type benchResult struct {
	Workload string `json:"workload"`
	// Servers is the size of the cluster --spawn started (0: --addr).
	Servers   int     `json:"servers,omitempty"`
	Clients   int     `json:"clients"`
	Seconds   float64 `json:"seconds"`
	Unit      string  `json:"unit"`        // what Ops counts
	Ops       int64   `json:"ops"`         // units done
	OpsPerSec float64 `json:"ops_per_sec"` // Ops / Seconds
	Requests  int64   `json:"requests"`    // HTTP requests measured
	Errors    int64   `json:"errors"`
	// ErrorCodes counts errors by contract code ("transport" for no answer).
	ErrorCodes map[string]int64 `json:"error_codes,omitempty"`
	// Latency is of one operation: a cycle, a grant (with its wait), a
	// renewal, a heartbeat request.
	Latency latencySummary `json:"latency"`
	// AcquireLatency is of the acquire alone (cycle only).
	AcquireLatency *latencySummary `json:"acquire_latency,omitempty"`
}

// latencySummary holds percentiles in milliseconds.
type latencySummary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted: the smallest sample such that at least p% of the samples are less
// than or equal to it. It returns 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The small epsilon absorbs binary rounding: 99.9% of 1000 must be
	// rank 999, not 1000 because 99.9 is not exact in floating point.
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	return sorted[min(max(rank, 1), n)-1]
}

// summarize sorts samples in place and summarizes them.
func summarize(samples []time.Duration) latencySummary {
	if len(samples) == 0 {
		return latencySummary{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return latencySummary{
		Count: len(samples),
		Mean:  ms(sum / time.Duration(len(samples))),
		P50:   ms(percentile(samples, 50)),
		P99:   ms(percentile(samples, 99)),
		P999:  ms(percentile(samples, 99.9)),
		Max:   ms(samples[len(samples)-1]),
	}
}

// benchWorker is one client's share of a workload.
type benchWorker struct {
	id       int
	ops      int64
	requests int64
	lat      []time.Duration
	acqLat   []time.Duration
	errs     map[string]int64
	// leases held across the measured phase (renew, heartbeat).
	leases []node.HeartbeatItem
	// conn is the worker's own connection (cycle, contended, renew, session).
	conn *benchConn
	// session is the worker's session (id and token) in the session workload.
	session node.HeartbeatItem
	// stream is the keep-alive stream the worker shares (keepalive).
	stream *client.RenewStream
}

func (w *benchWorker) fail(err error) {
	code := string(client.ErrorCode(err))
	if code == "" {
		code = "transport"
	}
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

func runWorkload(ctx context.Context, c *client.Client, workload string, cfg benchConfig) (*benchResult, error) {
	// name is the operation: half-load is the cycle at a set rate.
	name := workload
	if workload == "half-load" {
		name = "cycle"
	}
	workers := make([]*benchWorker, cfg.clients)
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
	for i := range workers {
		workers[i] = &benchWorker{id: i, errs: map[string]int64{},
			conn: newBenchConn(hosts[i%len(hosts)], cfg.token, cmp.Or(cfg.timeout, 30*time.Second), tlsConfs[i%len(hosts)])}
		defer workers[i].conn.close()
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
	setupTTL := cfg.ttl
	var perWorker int
	switch name {
	case "renew", "keepalive":
		perWorker = 1
	case "heartbeat", "session":
		perWorker = cfg.batch
		// The first leases must outlive the setup of all the others.
		setupTTL = max(cfg.ttl, benchSetupTimeout)
	}
	if perWorker > 0 {
		sctx, cancel := context.WithTimeout(ctx, benchSetupTimeout)
		err := forEachWorker(workers, func(w *benchWorker) error {
			req := node.AcquireRequest{Holder: holder(w), TTLMS: millis(setupTTL)}
			if name == "session" {
				s, err := c.CreateSession(sctx, node.SessionRequest{Holder: holder(w), TTLMS: millis(setupTTL)})
				if err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				w.session = node.HeartbeatItem{LeaseID: s.SessionID, Token: s.Token}
				req = node.AcquireRequest{SessionID: s.SessionID, SessionToken: s.Token}
			}
			for j := range perWorker {
				req.Key = key(w.id, j)
				l, err := c.Acquire(sctx, req)
				if err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				w.leases = append(w.leases, node.HeartbeatItem{LeaseID: l.LeaseID, Token: l.Token})
			}
			return nil
		})
		cancel()
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

	start := time.Now()
	run.end = start.Add(cfg.duration)
	_ = forEachWorker(workers, func(w *benchWorker) error {
		switch name {
		case "cycle":
			benchCycle(ctx, run, w, holder(w), func(n int64) string { return key(w.id, n) })
		case "contended":
			benchContended(ctx, run, w, holder(w), key("one"))
		case "renew":
			benchRenew(ctx, run, w)
		case "keepalive":
			benchKeepAlive(ctx, run, w)
		case "heartbeat":
			benchHeartbeat(ctx, run, w)
		case "session":
			benchSession(ctx, run, w)
		case fillWorkload:
			benchFill(ctx, run, w, holder(w), func(n int64) string { return key(w.id, n) })
		}
		return nil
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	elapsed := min(time.Since(start), cfg.duration)

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
	return res, nil
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
func heartbeatChunks(items []node.HeartbeatItem) [][]node.HeartbeatItem {
	if len(items) == 0 {
		return nil
	}
	// {"lease_id":"…","token":"…"}, plus the envelope {"leases":[…]}.
	per := len(items[0].LeaseID) + len(items[0].Token) + len(`{"lease_id":"","token":""},`) + 8 // slack for longer ids
	n := max((maxBodyBytes-64)/per, 1)
	var out [][]node.HeartbeatItem
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
			_, _ = c.Release(cctx, node.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token, Reason: "bench done"})
		}
		return nil
	})
}

func printBench(out io.Writer, results []*benchResult) error {
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', tabwriter.AlignRight)
	spawned := slices.ContainsFunc(results, func(r *benchResult) bool { return r.Servers > 0 })
	lead := func(r *benchResult) string {
		if spawned {
			return strconv.Itoa(r.Servers) + "\t"
		}
		return ""
	}
	if spawned {
		fmt.Fprint(tw, "servers\t")
	}
	fmt.Fprintln(tw, "workload\tclients\tops/s\tunit\tops\trequests\terrors\tp50 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range results {
		fmt.Fprintf(tw, "%s%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", lead(r), r.Workload, r.Clients,
			strconv.FormatFloat(r.OpsPerSec, 'f', 0, 64), r.Unit, r.Ops, r.Requests, r.Errors,
			f(r.Latency.P50), f(r.Latency.P99), f(r.Latency.P999), f(r.Latency.Max))
		if a := r.AcquireLatency; a != nil {
			fmt.Fprintf(tw, "%s  (acquire)\t\t\t\t\t\t\t%s\t%s\t%s\t%s\t\n", lead(r), f(a.P50), f(a.P99), f(a.P999), f(a.Max))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		if len(r.ErrorCodes) > 0 {
			codes := slices.Sorted(maps.Keys(r.ErrorCodes))
			fmt.Fprintf(out, "%s errors:", r.Workload)
			for _, k := range codes {
				fmt.Fprintf(out, " %s=%d", k, r.ErrorCodes[k])
			}
			fmt.Fprintln(out)
		}
	}
	return nil
}

// benchSession heartbeats one session with --batch leases bound to it: each
// heartbeat keeps all of them alive with one log write.
func benchSession(ctx context.Context, r *benchRun, w *benchWorker) {
	benchLoop(ctx, r, w, func(int64) (int64, error) {
		return int64(len(w.leases)), w.conn.sessionHeartbeat(w.session.LeaseID, w.session.Token)
	})
}
