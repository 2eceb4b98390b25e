package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/api/client"
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
	// grant: acquires and renewals ask for a grant (signed by the server).
	grant bool
	// via is how the per-request workloads reach the server: viaRaw or
	// viaClient (benchvia.go).
	via string
}

// benchSetupTimeout bounds a workload's setup (acquiring the leases that
// renew and heartbeat then keep alive) and its cleanup.
const benchSetupTimeout = 2 * time.Minute

// maxBodyBytes is the contract's request body limit; bulk heartbeats are
// split to stay under it.
const maxBodyBytes = 64 << 10

// benchOptions is what bench's flags ask for.
type benchOptions struct {
	cf        clientFlags
	cfg       benchConfig
	workloads []string
	sizes     []int // --spawn: the clusters to start, or none for --addr
	serverBin string
	raftLog   string
	vias      []string // --via, in order
}

func (a *app) benchCmd(ctx context.Context, args []string) error {
	relaxGC()
	o, err := a.parseBenchFlags(args)
	if err != nil {
		return err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 2 * o.cfg.clients
	t.MaxIdleConnsPerHost = o.cfg.clients
	t.DisableCompression = true
	t.ForceAttemptHTTP2 = false
	if o.cfg.tls, err = o.cf.tls.config(); err != nil {
		return err
	}
	t.TLSClientConfig = o.cfg.tls
	defer t.CloseIdleConnections()
	results, err := a.runBenches(ctx, o, t)
	if err != nil {
		return err
	}
	if o.cf.json {
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

// parseBenchFlags reads and checks bench's flags.
func (a *app) parseBenchFlags(args []string) (*benchOptions, error) {
	fs := a.newFlagSet("bench", "", "Drive a running node over HTTP with concurrent clients and report throughput and latency.\n"+
		"Workloads: cycle (acquire + release on distinct keys), contended (every client acquires one key,\n"+
		"waiting, then releases), renew (single-lease renewals), keepalive (single-lease renewals over\n"+
		"keep-alive streams, --stream-clients clients per stream), heartbeat (bulk heartbeats; counts leases\n"+
		"kept alive), session (heartbeats of a session with --batch bound leases; counts leases kept alive),\n"+
		"half-load (cycle paced at half the rate the cycle workload just reached: latency below saturation),\n"+
		"all (each in turn; not fill). fill acquires leases on distinct keys and leaves them to their TTL\n"+
		"(a server holding --max-ops live leases). Each workload runs for --duration or --max-ops, whichever ends first.\n"+
		"--spawn 1,3 starts throwaway clusters of this binary on loopback (one server, then three) and benches\n"+
		"each one's leader in turn, instead of --addr. --via client sends the per-request workloads (cycle, half-load,\n"+
		"contended, renew, session, fill) through the Go client (api/client) instead of the load generator's own\n"+
		"connections, to show what a Go program pays; --via raw,client runs each both ways (keepalive and heartbeat\n"+
		"always use the Go client).")
	o := &benchOptions{cfg: benchConfig{runID: randomID(4)}}
	o.cf.register(fs)
	cfg := &o.cfg
	workload := fs.String("workload", "all", "comma-separated: cycle, half-load, contended, renew, keepalive, heartbeat, session, all, or fill")
	spawn := fs.String("spawn", "", "comma-separated cluster sizes (1-7) to start on loopback and bench in turn, e.g. 1,3 (instead of --addr)")
	fs.StringVar(&o.serverBin, "server-bin", "", "with --spawn: the leasehold binary to run the servers (default: this one), to compare versions with one load generator")
	fs.StringVar(&o.raftLog, "raft-log", "", "with --spawn: the servers' --raft-log (boltdb or wal; default: the server's default), to compare log stores")
	fs.IntVar(&cfg.clients, "clients", 64, "concurrent clients")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time per workload")
	fs.IntVar(&cfg.perStream, "stream-clients", 8, "clients sharing one keep-alive stream (keepalive)")
	fs.IntVar(&cfg.batch, "batch", 1000, "leases each client keeps alive per heartbeat round (split into requests under 64 KiB)")
	fs.DurationVar(&cfg.ttl, "ttl", 30*time.Second, "TTL of the leases the bench acquires")
	fs.Int64Var(&cfg.maxOps, "max-ops", 10_000_000, "stop a workload after this many operations")
	fs.Float64Var(&cfg.rate, "rate", 0, "target operations per second over all clients (0: unlimited)")
	fs.StringVar(&cfg.prefix, "prefix", "", "key prefix (default bench/<random>/)")
	via := fs.String("via", viaRaw, "how the per-request workloads reach the server: raw (the load generator's own HTTP/1.1 connections), client (api/client, as a Go program), or raw,client")
	fs.BoolVar(&cfg.grant, "grant", false, "acquires and single renewals ask for a grant (a signed JWS), to measure what signing costs")
	err := a.parseNone(fs, args, clientEnv(), "")
	if err != nil {
		return nil, err
	}
	if o.workloads, err = parseBenchWorkloads(*workload); err != nil {
		return nil, err
	}
	if o.vias, err = parseVia(*via); err != nil {
		return nil, usageErrorf("%v", err)
	}
	if o.sizes, err = parseSpawn(*spawn); err != nil {
		return nil, err
	}
	if len(o.sizes) > 0 {
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "addr" })
		if explicit {
			return nil, usageErrorf("--spawn benches servers it starts itself: drop --addr")
		}
	}
	if o.raftLog != "" && (len(o.sizes) == 0 || o.raftLog != "boltdb" && o.raftLog != "wal") {
		return nil, usageErrorf("--raft-log: boltdb or wal, with --spawn")
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.prefix == "" {
		cfg.prefix = "bench/" + cfg.runID + "/"
	}
	cfg.token, cfg.timeout = o.cf.token, o.cf.timeout
	return o, nil
}

// parseBenchWorkloads reads --workload: names, "all" standing for every
// workload but fill.
func parseBenchWorkloads(v string) ([]string, error) {
	var workloads []string
	for _, w := range splitList(v) {
		switch {
		case w == "all":
			workloads = append(workloads, benchWorkloads...)
		case slices.Contains(benchWorkloads, w) || w == fillWorkload:
			workloads = append(workloads, w)
		default:
			return nil, usageErrorf("--workload %q: want %s, all or fill", w, strings.Join(benchWorkloads, ", "))
		}
	}
	if len(workloads) == 0 {
		return nil, usageErrorf("--workload: name at least one")
	}
	return workloads, nil
}

// check refuses the flags' values out of range.
func (cfg *benchConfig) check() error {
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
	return nil
}

// runBenches runs the workloads against --addr, or against each cluster
// --spawn starts in turn.
func (a *app) runBenches(ctx context.Context, o *benchOptions, t *http.Transport) ([]*benchResult, error) {
	newClient := func(addrs []string) (*client.Client, error) {
		return client.New(addrs, client.Options{Token: o.cf.token, Timeout: o.cf.timeout,
			HTTPClient: &http.Client{Transport: t}, TLSConfig: o.cfg.tls})
	}
	var results []*benchResult
	if len(o.sizes) == 0 {
		c, err := newClient(splitList(o.cf.addr))
		if err != nil {
			return nil, usageErrorf("--addr: %v", err)
		}
		return a.runBenchWorkloads(ctx, o, c, 0, results)
	}
	for _, n := range o.sizes {
		if !o.cf.json {
			fmt.Fprintf(a.stderr, "bench: starting %d server(s) on loopback...\n", n)
		}
		var extra []string
		if o.raftLog != "" {
			extra = []string{"--raft-log", o.raftLog}
		}
		sc, err := spawnCluster(ctx, n, o.serverBin, extra)
		if err != nil {
			return nil, err
		}
		c, err := newClient([]string{sc.leader})
		if err == nil {
			results, err = a.runBenchWorkloads(ctx, o, c, n, results)
		}
		sc.stop()
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// runBenchWorkloads runs every workload against c in turn and appends their
// results to results; servers is the size of the cluster --spawn started (0:
// --addr).
func (a *app) runBenchWorkloads(ctx context.Context, o *benchOptions, c *client.Client, servers int, results []*benchResult) ([]*benchResult, error) {
	for _, via := range o.vias {
		cfg := o.cfg
		cfg.via = via
		var peak float64 // the cycle workload's rate in this run
		for _, w := range o.workloads {
			if via == viaClient && !viaMatters(w) {
				continue // it goes through the Go client either way
			}
			wcfg := cfg
			if w == "half-load" {
				if peak == 0 {
					return results, usageErrorf("--workload half-load runs after cycle (it paces itself at half the cycle's rate)")
				}
				wcfg.rate = peak / 2
			}
			if !o.cf.json {
				fmt.Fprintf(a.stderr, "bench: %s, %d clients, %s...\n", viaLabel(w, via), cfg.clients, cfg.duration)
			}
			r, err := runWorkload(ctx, c, w, wcfg)
			if err != nil {
				return results, fmt.Errorf("%s: %w", viaLabel(w, via), err)
			}
			if w == "cycle" {
				peak = r.OpsPerSec
			}
			r.Servers = servers
			if via == viaClient {
				r.Via = via
			}
			results = append(results, r)
		}
	}
	return results, nil
}
