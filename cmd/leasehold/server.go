package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/node"
	"github.com/prometheus/client_golang/prometheus"
)

// serverConfig is what the server subcommand runs with.
type serverConfig struct {
	node          node.Config // Logger and HTTPAddr are filled in at start
	httpAddr      string      // where HTTP listens
	httpAdvertise string      // what peers are told; empty: the bound address
	tokensFile    string
	sealKeyFile   string
	grantKeyFile  string
	logLevel      slog.Level
	logFormat     string // text or json
	// HTTP hardening (api.Options, http.Server).
	bodyTimeout      time.Duration
	writeTimeout     time.Duration
	idleTimeout      time.Duration
	streamsPerClient int
	tls              serverTLSFlags
	pprofAddr        string // loopback address of the Go profiler; empty: off
	reloadInterval   time.Duration
}

// Fixed HTTP limits: a client has this long to send its request line and
// headers, which may total this many bytes.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpMaxHeaderBytes    = 64 << 10
)

// --raft-timeout: node.Config's default (its zero) and the bounds the flag
// accepts. Below the minimum, Raft's leader lease (half of it) is shorter
// than a scheduling stall of a healthy machine; above the maximum, a dead
// leader goes unnoticed for minutes.
const (
	defaultRaftTimeout = 500 * time.Millisecond
	minRaftTimeout     = 50 * time.Millisecond
	maxRaftTimeout     = time.Minute
)

// Graceful shutdown: first let requests finish while event streams stay
// open, then end streams and waiting acquires, then force.
const (
	shutdownGrace = 2 * time.Second
	shutdownForce = 5 * time.Second
)

// parseServerFlags reads the server's flags, each flag falling back to
// LEASEHOLD_<FLAG> from lookupEnv; flags win over the environment.
func (a *app) parseServerFlags(args []string) (serverConfig, error) {
	def := node.DefaultConfig()
	fs := a.newFlagSet("server", "", "Run a Leasehold node: Raft, the lease state machine and the HTTP API.\n"+
		"Every flag also reads LEASEHOLD_<FLAG> (--http-addr: LEASEHOLD_HTTP_ADDR); flags win.\n"+
		"With no flags: a single-node cluster on 127.0.0.1:7700 (HTTP), 7701 (Raft), 7702 (gossip), data in ./leasehold-data.")
	cfg := serverConfig{node: def}
	join, level := cfg.register(fs, def)
	pos, err := a.parse(fs, args, envVars(allFlags(fs)...), 0)
	if err != nil {
		return cfg, err
	}
	if len(pos) != 0 {
		return cfg, usageErrorf("server takes no arguments, got %q", pos)
	}
	cfg.node.Join = splitList(*join)
	if cfg.node.WALSegmentSize, err = a.testWALSegmentSize(); err != nil {
		return cfg, err
	}
	if err := cfg.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return cfg, usageErrorf("--log-level %q: want debug, info, warn or error", *level)
	}
	err = cfg.check()
	return cfg, err
}

// testWALSegmentEnv sets the segment size of a raft-wal log (bytes or
// e.g. 8MiB; node.Config.WALSegmentSize) for the process-level tests that
// fill a segment: filling the default, 64 MiB, took about 40 s of writes
// under the race detector. It is no flag, not in the help, and not for
// operators.
const testWALSegmentEnv = "LEASEHOLD_TEST_WAL_SEGMENT_SIZE"

// testWALSegmentSize reads testWALSegmentEnv (0 when unset or empty).
func (a *app) testWALSegmentSize() (int, error) {
	v, ok := a.lookupEnv(testWALSegmentEnv)
	if !ok || v == "" {
		return 0, nil
	}
	lo, hi := int64(cluster.MinWALSegmentSize), int64(cluster.MaxWALSegmentSize)
	n, err := parseByteSize(v)
	if err != nil || n < lo || n > hi {
		return 0, usageErrorf("%s=%q: want a size of %s-%s (a test setting)", testWALSegmentEnv, v, byteSize{&lo}, byteSize{&hi})
	}
	return int(n), nil
}

// register defines the server's flags on fs, with def's defaults; --join
// and --log-level are left for the caller to read.
func (cfg *serverConfig) register(fs *flag.FlagSet, def node.Config) (join, level *string) {
	fs.StringVar(&cfg.node.NodeID, "node-id", def.NodeID, "this server's id in the cluster")
	fs.StringVar(&cfg.node.DataDir, "data-dir", def.DataDir, "directory of the Raft log, stable store and snapshots")
	fs.StringVar(&cfg.node.RaftLog, "raft-log", "", "Raft log store of a NEW data dir: boltdb (in raft.db) or wal (in wal/, raft-wal); default "+cluster.DefaultLogStore+
		". An existing data dir keeps its own; a value that disagrees is an error (move a log offline with 'leasehold data migrate-log')")
	fs.StringVar(&cfg.httpAddr, "http-addr", def.HTTPAddr, "HTTP API listen address")
	fs.StringVar(&cfg.httpAdvertise, "http-advertise", "", "HTTP address peers and cluster status show (default: the bound --http-addr)")
	fs.StringVar(&cfg.node.RaftAddr, "raft-addr", def.RaftAddr, "Raft bind address")
	fs.StringVar(&cfg.node.RaftAdvertise, "raft-advertise", "", "Raft address other servers reach this one at (default: --raft-addr); a host name is kept as the address and resolved on every dial")
	fs.StringVar(&cfg.node.GossipAddr, "gossip-addr", def.GossipAddr, "gossip (membership) bind address, UDP and TCP")
	fs.StringVar(&cfg.node.AdvertiseAddr, "advertise-addr", "", "host or IP the other servers reach this one at (Raft, gossip, and HTTP when bound to 0.0.0.0); a name stays the Raft address (resolved on every dial), gossip resolves it at start")
	join = fs.String("join", "", "comma-separated gossip addresses of members to contact (any one is enough)")
	fs.IntVar(&cfg.node.BootstrapExpect, "bootstrap-expect", def.BootstrapExpect, "new cluster: wait for this many servers, then form it (0 or 1: a single server bootstraps alone)")
	fs.DurationVar(&cfg.node.JoinTimeout, "join-timeout", def.JoinTimeout, "how long a new server keeps trying --join before giving up")
	fs.DurationVar(&cfg.node.DeadServerTimeout, "dead-server-timeout", 0, "remove a server after it has been failed this long (0: only an operator removes servers); never below 3 voters")
	fs.DurationVar(&cfg.node.TickPeriod, "tick-period", def.TickPeriod, "cluster clock resolution (10ms-10s)")
	fs.DurationVar(&cfg.node.RaftTimeout, "raft-timeout", defaultRaftTimeout, "Raft's heartbeat and election timeout ("+
		minRaftTimeout.String()+"-"+maxRaftTimeout.String()+"; the leader lease is half of it): lower fails over sooner on a quiet network, "+
		"higher keeps a leader through scheduling stalls of a busy machine; the same on every server")
	fs.DurationVar(&cfg.node.Retention, "retention", def.Retention, "how long ended leases and sessions stay readable")
	fs.Uint64Var(&cfg.node.SnapshotThreshold, "snapshot-threshold", def.SnapshotThreshold, "log entries since the last snapshot that trigger a new one")
	fs.DurationVar(&cfg.node.SnapshotInterval, "snapshot-interval", def.SnapshotInterval, "how often the snapshot threshold is checked")
	fs.DurationVar(&cfg.node.StateCheckInterval, "state-check-interval", def.StateCheckInterval,
		"how often the leader compares every server's state (a server that differs takes itself out of service); 0: off")
	fs.DurationVar(&cfg.node.ApplyStallTimeout, "apply-stall-timeout", def.ApplyStallTimeout, "a follower whose applied index has not advanced this long while the cluster went on without it is frozen: /readyz answers 503 with the reason")
	fs.Uint64Var(&cfg.node.TrailingLogs, "trailing-logs", def.TrailingLogs, "log entries kept after a snapshot for followers that lag (0: 10240); a follower further behind gets the snapshot")
	fs.IntVar(&cfg.node.MaxLeases, "max-leases", def.MaxLeases, "most live leases (active or queued) in the cluster; 0: no limit")
	fs.IntVar(&cfg.node.MaxLeasesPerHolder, "max-leases-per-holder", def.MaxLeasesPerHolder, "most active leases of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxSessions, "max-sessions", def.MaxSessions, "most active sessions in the cluster; 0: no limit")
	fs.IntVar(&cfg.node.MaxSessionsPerHolder, "max-sessions-per-holder", def.MaxSessionsPerHolder, "most active sessions of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxWaitersPerKey, "max-waiters-per-key", def.MaxWaitersPerKey, "most queued acquires (wait_ms) of one key; 0: no limit")
	fs.IntVar(&cfg.node.MaxWaitersPerHolder, "max-waiters-per-holder", def.MaxWaitersPerHolder, "most queued acquires (wait_ms) of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxRetained, "max-retained", def.MaxRetained, "most ended leases and sessions kept for --retention; the oldest are pruned first; 0: no limit")
	fs.StringVar(&cfg.node.SkipRestore, "skip-restore", "", "the id (rs_...) of a committed restore this server applies as a refusal that changes nothing: "+
		"the way out when no server can apply it (set it on every server, and only if none applied it; see docs/operations.md)")
	fs.Var(byteSize{&cfg.node.MinFreeDisk}, "min-free-disk", "free-space guard: below this much free space on the data directory's filesystem (this server's, or a voter's), "+
		"the leader refuses acquires and new sessions (429 RESOURCE_EXHAUSTED, field min_free_disk); renewals, heartbeats, releases and revokes go on. "+
		"Bytes or e.g. 512MiB; 0: max(256MiB, twice the latest snapshot); -1: off")
	fs.DurationVar(&cfg.node.LogFailureTimeout, "log-failure-timeout", node.DefaultLogFailureTimeout,
		"when every write to the Raft log has failed this long (a full disk), exit with status 74 for a supervisor to restart the server "+
			"(sooner, once the disk has room again and the log still fails); -1s: only then")
	fs.IntVar(&cfg.node.MaxEventStreams, "max-event-streams", def.MaxEventStreams, "most event streams open on this server; 0: no limit")
	fs.IntVar(&cfg.streamsPerClient, "max-event-streams-per-client", api.DefaultMaxStreamsPerClient, "most event streams one client address keeps open on this server; 0: no limit")
	fs.DurationVar(&cfg.writeTimeout, "http-write-timeout", api.DefaultWriteTimeout, "how long an answer may take to be written (not event streams, control WebSockets, snapshot transfers; an acquire gets its wait_ms on top); 0: no limit")
	fs.DurationVar(&cfg.bodyTimeout, "http-body-timeout", api.DefaultBodyTimeout, "how long a client has to send a request body (a snapshot upload: between reads); 0: no limit")
	fs.DurationVar(&cfg.idleTimeout, "http-idle-timeout", 2*time.Minute, "idle keep-alive connections are closed after this long")
	fs.StringVar(&cfg.sealKeyFile, "seal-key-file", "", "file holding the base64 sealing key ('leasehold keygen'), the same on every server, kept apart from the data directory and backups "+
		"(default: derived from the gossip key; neither: idempotency keys are unkeyed SHA-256 in the log and backups)")
	fs.BoolVar(&cfg.node.SealKeyRotate, "seal-key-rotate", false, "record this server's sealing key over the cluster's when it leads (a key rotation; see docs/security.md)")
	fs.StringVar(&cfg.grantKeyFile, "grant-key-file", "", "this server's grant signing key (Ed25519, PKCS #8 PEM: 'leasehold keygen --grant'); "+
		"default: grant.key in the data directory, made at first start")
	fs.DurationVar(&cfg.node.GrantKeyRetention, "grant-key-retention", def.GrantKeyRetention, "how long GET /v1/keys lists a retired grant key (a rotation, a removed server), "+
		"so grants it signed still verify; the same on every server; 0: not at all")
	fs.StringVar(&cfg.tokensFile, "tokens-file", "", "bearer tokens file (JSON; see 'leasehold token create'); none: auth is off. Reloaded on SIGHUP and when the file changes")
	fs.DurationVar(&cfg.reloadInterval, "reload-interval", defaultReloadInterval, "how often the tokens file, certificates and CA bundles are checked for changes (SIGHUP reloads them at once); 0: only on SIGHUP")
	level = fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&cfg.pprofAddr, "pprof-addr", "", "loopback address serving Go's profiler (/debug/pprof/) for performance work; off by default")
	cfg.tls.register(fs)
	return join, level
}

// check refuses, as usage errors, the flags' values the server cannot run
// with.
func (cfg *serverConfig) check() error {
	switch cfg.logFormat {
	case "text", "json":
	default:
		return usageErrorf("--log-format %q: want text or json", cfg.logFormat)
	}
	if cfg.httpAddr == "" {
		return usageErrorf("--http-addr is required")
	}
	if cfg.reloadInterval < 0 {
		return usageErrorf("--reload-interval must not be negative")
	}
	if cfg.streamsPerClient < 0 || cfg.bodyTimeout < 0 || cfg.writeTimeout < 0 || cfg.idleTimeout <= 0 {
		return usageErrorf("--max-event-streams-per-client, --http-body-timeout and --http-write-timeout must not be negative, --http-idle-timeout must be positive")
	}
	if err := cfg.tls.check(); err != nil {
		return err
	}
	if err := checkPprofAddr(cfg.pprofAddr); err != nil {
		return err
	}
	if err := cfg.nodeFlags(); err != nil {
		return err
	}
	// Check what node.Open would refuse now, as a usage error. HTTPAddr is
	// settled once the listener is bound.
	if err := cfg.node.Validate(); err != nil {
		return usageErrorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

// nodeFlags maps the flags' zeros to node.Config's rule, where zero means
// the default. The flags whose 0 says "no limit" or "off" (--join-timeout:
// one attempt) are refused when negative, and their 0 becomes
// node.Config's -1; --tick-period and --retention refuse 0;
// --snapshot-interval 0 means Raft's own default, 2 minutes.
func (cfg *serverConfig) nodeFlags() error {
	n := &cfg.node
	for _, f := range []struct {
		name string
		v    *int
	}{
		{"--max-leases", &n.MaxLeases}, {"--max-leases-per-holder", &n.MaxLeasesPerHolder},
		{"--max-sessions", &n.MaxSessions}, {"--max-sessions-per-holder", &n.MaxSessionsPerHolder},
		{"--max-waiters-per-key", &n.MaxWaitersPerKey}, {"--max-waiters-per-holder", &n.MaxWaitersPerHolder},
		{"--max-retained", &n.MaxRetained}, {"--max-event-streams", &n.MaxEventStreams},
	} {
		if *f.v < 0 {
			return usageErrorf("%s must not be negative (0: no limit)", f.name)
		}
		*f.v = orNegative(*f.v)
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
	}{
		{"--join-timeout", &n.JoinTimeout}, {"--dead-server-timeout", &n.DeadServerTimeout},
		{"--state-check-interval", &n.StateCheckInterval}, {"--grant-key-retention", &n.GrantKeyRetention},
	} {
		if *f.v < 0 {
			return usageErrorf("%s must not be negative", f.name)
		}
		*f.v = orNegative(*f.v)
	}
	if n.TickPeriod == 0 {
		return usageErrorf("--tick-period 0s outside 10ms-10s")
	}
	if n.RaftTimeout < minRaftTimeout || n.RaftTimeout > maxRaftTimeout {
		return usageErrorf("--raft-timeout %v outside %v-%v", n.RaftTimeout, minRaftTimeout, maxRaftTimeout)
	}
	if n.Retention == 0 {
		return usageErrorf("--retention 0s shorter than one tick")
	}
	n.SnapshotInterval = cmp.Or(n.SnapshotInterval, 2*time.Minute)
	return nil
}

func newLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func (a *app) serverCmd(ctx context.Context, args []string) error {
	cfg, err := a.parseServerFlags(args)
	if err != nil {
		return err
	}
	log := newLogger(a.stderr, cfg.logLevel, cfg.logFormat)
	sec, tokens, err := loadServerSecrets(&cfg, log)
	if err != nil {
		return err
	}
	httpOpts := apiOptions(cfg, tokens, sec.forward, log)
	if err := httpOpts.Validate(); err != nil {
		return fmt.Errorf("http options: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	defer ln.Close()
	if cfg.pprofAddr != "" {
		stopPprof, err := servePprof(cfg.pprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	scheme := "http"
	if sec.http != nil {
		ln, scheme = tls.NewListener(ln, sec.http), "https"
	}
	reload := newReloader(cfg.tokensFile, tokens, sec, log)
	if cfg.node.Registry == nil {
		cfg.node.Registry = prometheus.NewRegistry()
	}
	reload.register(cfg.node.Registry, sec)
	defer reload.run(ctx, cfg.reloadInterval)()
	cfg.node.HTTPAddr = httpAdvertised(cfg, ln.Addr())
	cfg.node.Version = versionString()
	cfg.node.Logger = log

	n, err := node.Open(cfg.node)
	if err != nil {
		return fmt.Errorf("open node: %w", err)
	}
	handler := api.New(api.FromNode(n), httpOpts)

	// Request contexts derive from streams, which is cancelled once the
	// grace period of a shutdown is over: event streams and waiting acquires
	// end then instead of holding Shutdown up.
	streams, endStreams := context.WithCancel(context.WithoutCancel(ctx))
	defer endStreams()
	srv := newHTTPServer(handler, cfg, streams, log)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	fmt.Fprintf(a.stdout, "leasehold %s: node %s serving %s://%s (raft %s, gossip %s, data %s)\n",
		versionString(), cfg.node.NodeID, scheme, ln.Addr(), cfg.node.RaftAddr, cfg.node.GossipAddr, cfg.node.DataDir)
	log.Info("server started", "node_id", cfg.node.NodeID, "http_addr", ln.Addr().String(),
		"raft_addr", cfg.node.RaftAddr, "gossip_addr", cfg.node.GossipAddr, "data_dir", cfg.node.DataDir,
		"join", cfg.node.Join, "bootstrap_expect", cfg.node.BootstrapExpect, "auth", tokens != nil,
		"https", sec.http != nil, "client_certs", sec.http != nil && sec.http.ClientCAs != nil,
		"raft_mtls", sec.raft != nil, "gossip_encrypted", len(sec.gossipKey) > 0,
		"seal_key", sealKeySource(cfg.sealKeyFile, sec.gossipKey), "grant_kid", n.GrantKeyID())
	notify := a.newNotifier(log)
	go notifyReady(streams, notify, n, log)

	runErr := waitServerStop(ctx, n, serveErr, log)
	notify.send("STOPPING=1")
	if err := shutdownHTTP(srv, endStreams); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	return closeNode(n, runErr, log)
}

// notifyReady sends READY=1 for systemd (Type=notify) on the condition of
// /readyz, unless ctx ends first.
func notifyReady(ctx context.Context, notify *notifier, n *node.Node, log *slog.Logger) {
	if notify.notifyWhenReady(ctx, n.Ready(), n.ReadyErr, 100*time.Millisecond) {
		log.Info("ready: leader known and log applied")
		// Restoring a large snapshot left its transient buffers'
		// pages mapped up to the memory limit; give them back once.
		debug.FreeOSMemory()
	}
}

// loadServerSecrets checks where plaintext would be served, reads the TLS,
// gossip, sealing and grant keys into cfg.node, relaxes the GC and reads the
// tokens file (nil tokens: auth is off), logging what an operator should
// know of each.
func loadServerSecrets(cfg *serverConfig, log *slog.Logger) (*serverTLS, *api.Tokens, error) {
	exposed, err := plaintextRefusal(cfg.httpAddr, cfg.node.RaftAddr, cfg.node.GossipAddr, &cfg.tls)
	if err != nil {
		return nil, nil, err
	}
	if len(exposed) > 0 {
		log.Warn("--insecure-plaintext: serving plaintext beyond loopback; anyone on the network can read and forge this traffic",
			"exposed", exposed)
	}
	sec, err := cfg.tls.load(log)
	if err != nil {
		return nil, nil, err
	}
	cfg.node.GossipKey, cfg.node.RaftTLS = sec.gossipKey, sec.raft
	if sec.http != nil && cfg.tls.ca == "" && len(cfg.node.Join) > 0 {
		log.Warn("no --tls-ca: a follower verifies the leader's HTTPS certificate against the system roots when forwarding; " +
			"set --tls-ca to the CA of the servers' certificates")
	}
	if cfg.node.SealKey, err = setupSealKey(cfg.sealKeyFile, sec.gossipKey, log); err != nil {
		return nil, nil, err
	}
	if cfg.grantKeyFile != "" {
		if cfg.node.GrantKey, err = loadGrantKeyFile(cfg.grantKeyFile, log); err != nil {
			return nil, nil, err
		}
	}
	cg := relaxGC()
	if cg > 0 {
		log.Info("memory cgroup limit found: the soft memory limit stays at or below 90% of it", "cgroup_limit_bytes", cg)
	}
	cfg.node.MemoryLimit = restoreMemLimit(cg)

	var tokens *api.Tokens
	if cfg.tokensFile != "" {
		if tokens, err = api.LoadTokens(cfg.tokensFile); err != nil {
			return nil, nil, err
		}
	} else {
		log.Warn("no --tokens-file: authentication is OFF; anyone who can reach the HTTP address has admin access",
			"http_addr", cfg.httpAddr)
	}
	return sec, tokens, nil
}

// httpAdvertised is the HTTP address the node tells its peers: --http-advertise,
// else the bound address, with --advertise-addr's host when bound to all
// addresses.
func httpAdvertised(cfg serverConfig, bound net.Addr) string {
	if cfg.httpAdvertise != "" {
		return cfg.httpAdvertise
	}
	addr := bound.String()
	if ta, ok := bound.(*net.TCPAddr); ok && ta.IP.IsUnspecified() && cfg.node.AdvertiseAddr != "" {
		addr = net.JoinHostPort(cfg.node.AdvertiseAddr, fmt.Sprint(ta.Port))
	}
	return addr
}

// waitServerStop waits for the server to be stopped (ctx), for its HTTP
// server to fail or for a storage failure, and returns the error to exit
// with (nil: asked to stop).
func waitServerStop(ctx context.Context, n *node.Node, serveErr <-chan error, log *slog.Logger) error {
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx))
		return nil
	case err := <-serveErr:
		log.Error("http server failed; shutting down", "err", err)
		return fmt.Errorf("http server: %w", err)
	case <-n.Failed():
		log.Error("storage failure: shutting down; restart the server (every acknowledged write is on disk)", "err", n.FailedErr())
		return &exitError{code: exitStorage, msg: "storage failure: " + n.FailedErr().Error()}
	}
}

// closeNode closes n once the HTTP server is shut down and returns runErr
// with what closing adds; after a storage failure it does not wait long.
func closeNode(n *node.Node, runErr error, log *slog.Logger) error {
	if runErr != nil && n.FailedErr() != nil {
		// The log cannot be written: close what can be closed, but do
		// not wait on it for long.
		closed := make(chan error, 1)
		go func() { closed <- n.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				log.Warn("node close after the storage failure", "err", err)
			}
		case <-time.After(failedCloseWait):
			log.Warn("node close after the storage failure did not finish in time; exiting anyway")
		}
		log.Info("stopped")
		return runErr
	}
	if err := n.Close(); err != nil {
		log.Error("node close", "err", err)
		runErr = errors.Join(runErr, fmt.Errorf("close node: %w", err))
	}
	log.Info("stopped")
	return runErr
}

// failedCloseWait bounds the close of a node that failed (its log cannot
// be written) before the server exits.
const failedCloseWait = 10 * time.Second

// shutdownHTTP stops accepting requests and waits for those in flight: up
// to shutdownGrace with event streams open, then, after endStreams, up to
// shutdownForce more before closing what is left.
func shutdownHTTP(srv *http.Server, endStreams context.CancelFunc) error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	err := srv.Shutdown(ctx)
	cancel()
	if err == nil {
		return nil
	}
	endStreams()
	ctx, cancel = context.WithTimeout(context.Background(), shutdownForce)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return errors.Join(err, srv.Close())
	}
	return nil
}

// apiOptions are the HTTP API's options: the defaults, with the hardening
// flags and the TLS a follower forwards to the leader with.
func apiOptions(cfg serverConfig, tokens *api.Tokens, forwardTLS *tls.Config, log *slog.Logger) api.Options {
	opts := api.DefaultOptions()
	opts.Logger = log.With("component", "http")
	opts.Tokens = tokens
	opts.BodyTimeout = orNegative(cfg.bodyTimeout)
	opts.WriteTimeout = orNegative(cfg.writeTimeout)
	opts.MaxStreamsPerClient = orNegative(cfg.streamsPerClient)
	opts.ForwardTLS = forwardTLS
	return opts
}

// orNegative maps a flag's 0 ("no limit", "off") to the -1 that says so
// to api.Options and node.Config, whose zero value means "the default".
func orNegative[T int | time.Duration](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// newHTTPServer is the API's HTTP server: request line and headers within
// httpReadHeaderTimeout and httpMaxHeaderBytes, idle connections closed
// after --http-idle-timeout. It has no ReadTimeout or WriteTimeout: they
// would cut event streams, WebSocket connections and long-polling acquires;
// bodies get a per-request read deadline in the handler (--http-body-timeout,
// lifted once they are read) and answers of the ordinary routes a write
// deadline (--http-write-timeout). Request contexts derive from base.
func newHTTPServer(handler http.Handler, cfg serverConfig, base context.Context, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          httpErrorLog(log.With("component", "http")),
	}
}
