package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
)

// serverConfig is what the server subcommand runs with.
type serverConfig struct {
	node          node.Config // Logger and HTTPAddr are filled in at start
	httpAddr      string      // where HTTP listens
	httpAdvertise string      // what peers are told; empty: the bound address
	tokensFile    string
	sealKeyFile   string
	logLevel      slog.Level
	logFormat     string // text or json
	// HTTP hardening (api.Options, http.Server).
	bodyTimeout      time.Duration
	writeTimeout     time.Duration
	idleTimeout      time.Duration
	streamsPerClient int
	tls              serverTLSFlags
	pprofAddr        string // loopback address of the Go profiler; empty: off
}

// Fixed HTTP limits: a client has this long to send its request line and
// headers, which may total this many bytes.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpMaxHeaderBytes    = 64 << 10
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
	fs.StringVar(&cfg.node.NodeID, "node-id", def.NodeID, "this server's id in the cluster")
	fs.StringVar(&cfg.node.DataDir, "data-dir", def.DataDir, "directory of the Raft log, stable store and snapshots")
	fs.StringVar(&cfg.httpAddr, "http-addr", def.HTTPAddr, "HTTP API listen address")
	fs.StringVar(&cfg.httpAdvertise, "http-advertise", "", "HTTP address peers and cluster status show (default: the bound --http-addr)")
	fs.StringVar(&cfg.node.RaftAddr, "raft-addr", def.RaftAddr, "Raft bind address")
	fs.StringVar(&cfg.node.RaftAdvertise, "raft-advertise", "", "Raft address other servers reach this one at (default: --raft-addr)")
	fs.StringVar(&cfg.node.GossipAddr, "gossip-addr", def.GossipAddr, "gossip (membership) bind address, UDP and TCP")
	fs.StringVar(&cfg.node.AdvertiseAddr, "advertise-addr", "", "host or IP the other servers reach this one at (Raft, gossip, and HTTP when bound to 0.0.0.0); a name is resolved at start")
	join := fs.String("join", "", "comma-separated gossip addresses of members to contact (any one is enough)")
	fs.IntVar(&cfg.node.BootstrapExpect, "bootstrap-expect", def.BootstrapExpect, "new cluster: wait for this many servers, then form it (0 or 1: a single server bootstraps alone)")
	fs.DurationVar(&cfg.node.JoinTimeout, "join-timeout", def.JoinTimeout, "how long a new server keeps trying --join before giving up")
	fs.DurationVar(&cfg.node.DeadServerTimeout, "dead-server-timeout", 0, "remove a server after it has been failed this long (0: only an operator removes servers); never below 3 voters")
	fs.DurationVar(&cfg.node.TickPeriod, "tick-period", def.TickPeriod, "cluster clock resolution (10ms-10s)")
	fs.DurationVar(&cfg.node.Retention, "retention", def.Retention, "how long ended leases and sessions stay readable")
	fs.Uint64Var(&cfg.node.SnapshotThreshold, "snapshot-threshold", def.SnapshotThreshold, "log entries since the last snapshot that trigger a new one")
	fs.DurationVar(&cfg.node.SnapshotInterval, "snapshot-interval", def.SnapshotInterval, "how often the snapshot threshold is checked")
	fs.Uint64Var(&cfg.node.TrailingLogs, "trailing-logs", def.TrailingLogs, "log entries kept after a snapshot for followers that lag (0: 10240); a follower further behind gets the snapshot")
	fs.IntVar(&cfg.node.MaxLeases, "max-leases", def.MaxLeases, "most live leases (active or queued) in the cluster; 0: no limit")
	fs.IntVar(&cfg.node.MaxLeasesPerHolder, "max-leases-per-holder", def.MaxLeasesPerHolder, "most active leases of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxSessions, "max-sessions", def.MaxSessions, "most active sessions in the cluster; 0: no limit")
	fs.IntVar(&cfg.node.MaxSessionsPerHolder, "max-sessions-per-holder", def.MaxSessionsPerHolder, "most active sessions of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxWaitersPerKey, "max-waiters-per-key", def.MaxWaitersPerKey, "most queued acquires (wait_ms) of one key; 0: no limit")
	fs.IntVar(&cfg.node.MaxWaitersPerHolder, "max-waiters-per-holder", def.MaxWaitersPerHolder, "most queued acquires (wait_ms) of one holder; 0: no limit")
	fs.IntVar(&cfg.node.MaxRetained, "max-retained", def.MaxRetained, "most ended leases and sessions kept for --retention; the oldest are pruned first; 0: no limit")
	fs.IntVar(&cfg.node.MaxEventStreams, "max-event-streams", def.MaxEventStreams, "most event streams open on this server; 0: no limit")
	fs.IntVar(&cfg.streamsPerClient, "max-event-streams-per-client", api.DefaultMaxStreamsPerClient, "most event streams one client address keeps open on this server; 0: no limit")
	fs.DurationVar(&cfg.writeTimeout, "http-write-timeout", api.DefaultWriteTimeout, "how long an answer may take to be written (not event streams, control WebSockets, snapshot transfers; an acquire gets its wait_ms on top); 0: no limit")
	fs.DurationVar(&cfg.bodyTimeout, "http-body-timeout", api.DefaultBodyTimeout, "how long a client has to send a request body (a snapshot upload: between reads); 0: no limit")
	fs.DurationVar(&cfg.idleTimeout, "http-idle-timeout", 2*time.Minute, "idle keep-alive connections are closed after this long")
	fs.StringVar(&cfg.sealKeyFile, "seal-key-file", "", "file holding the base64 sealing key ('leasehold keygen'), the same on every server, kept apart from the data directory and backups "+
		"(default: derived from the gossip key; neither: idempotency keys are unkeyed SHA-256 in the log and backups)")
	fs.BoolVar(&cfg.node.SealKeyRotate, "seal-key-rotate", false, "record this server's sealing key over the cluster's when it leads (a key rotation; see docs/security.md)")
	fs.StringVar(&cfg.tokensFile, "tokens-file", "", "bearer tokens file (JSON; see 'leasehold token create'); none: auth is off")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&cfg.pprofAddr, "pprof-addr", "", "loopback address serving Go's profiler (/debug/pprof/) for performance work; off by default")
	cfg.tls.register(fs)
	pos, err := a.parse(fs, args, allFlags(fs), 0)
	if err != nil {
		return cfg, err
	}
	if len(pos) != 0 {
		return cfg, usageErrorf("server takes no arguments, got %q", pos)
	}
	cfg.node.Join = splitList(*join)
	if err := cfg.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return cfg, usageErrorf("--log-level %q: want debug, info, warn or error", *level)
	}
	switch cfg.logFormat {
	case "text", "json":
	default:
		return cfg, usageErrorf("--log-format %q: want text or json", cfg.logFormat)
	}
	if cfg.httpAddr == "" {
		return cfg, usageErrorf("--http-addr is required")
	}
	if cfg.streamsPerClient < 0 || cfg.bodyTimeout < 0 || cfg.writeTimeout < 0 || cfg.idleTimeout <= 0 {
		return cfg, usageErrorf("--max-event-streams-per-client, --http-body-timeout and --http-write-timeout must not be negative, --http-idle-timeout must be positive")
	}
	if err := cfg.tls.check(); err != nil {
		return cfg, err
	}
	if err := checkPprofAddr(cfg.pprofAddr); err != nil {
		return cfg, err
	}
	// Check what node.Open would refuse now, as a usage error. HTTPAddr is
	// settled once the listener is bound.
	if err := cfg.node.Validate(); err != nil {
		return cfg, usageErrorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return cfg, nil
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
	exposed, err := plaintextRefusal(cfg.httpAddr, cfg.node.RaftAddr, cfg.node.GossipAddr, &cfg.tls)
	if err != nil {
		return err
	}
	if len(exposed) > 0 {
		log.Warn("--insecure-plaintext: serving plaintext beyond loopback; anyone on the network can read and forge this traffic",
			"exposed", exposed)
	}
	sec, err := cfg.tls.load(log)
	if err != nil {
		return err
	}
	cfg.node.GossipKey, cfg.node.RaftTLS = sec.gossipKey, sec.raft
	if sec.http != nil && cfg.tls.ca == "" && len(cfg.node.Join) > 0 {
		log.Warn("no --tls-ca: a follower verifies the leader's HTTPS certificate against the system roots when forwarding; " +
			"set --tls-ca to the CA of the servers' certificates")
	}
	if cfg.node.SealKey, err = setupSealKey(cfg.sealKeyFile, sec.gossipKey, log); err != nil {
		return err
	}
	relaxGC()

	var tokens *api.Tokens
	if cfg.tokensFile != "" {
		if tokens, err = api.LoadTokens(cfg.tokensFile); err != nil {
			return err
		}
	} else {
		log.Warn("no --tokens-file: authentication is OFF; anyone who can reach the HTTP address has admin access",
			"http_addr", cfg.httpAddr)
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
	if len(sec.pairs) > 0 {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		reloadCtx, stopReload := context.WithCancel(ctx)
		defer stopReload()
		go reloadOnSignal(reloadCtx, hup, sec.pairs, log)
	}
	cfg.node.HTTPAddr = cfg.httpAdvertise
	if cfg.node.HTTPAddr == "" {
		cfg.node.HTTPAddr = ln.Addr().String()
		if ta, ok := ln.Addr().(*net.TCPAddr); ok && ta.IP.IsUnspecified() && cfg.node.AdvertiseAddr != "" {
			cfg.node.HTTPAddr = net.JoinHostPort(cfg.node.AdvertiseAddr, fmt.Sprint(ta.Port))
		}
	}
	node.Version = versionString()
	cfg.node.Logger = log

	n, err := node.Open(cfg.node)
	if err != nil {
		return fmt.Errorf("open node: %w", err)
	}
	handler := api.New(api.FromNode(n), api.Options{Logger: log.With("component", "http"), Tokens: tokens,
		BodyTimeout: orNegative(cfg.bodyTimeout), WriteTimeout: orNegative(cfg.writeTimeout), MaxStreamsPerClient: orNegative(cfg.streamsPerClient), ForwardTLS: sec.forward})

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
		"seal_key", sealKeySource(cfg.sealKeyFile, sec.gossipKey))
	notify := a.newNotifier(log)
	go func() {
		// READY=1 for systemd (Type=notify) on the condition of /readyz.
		if notify.notifyWhenReady(streams, n.Ready(), n.ReadyErr, 100*time.Millisecond) {
			log.Info("ready: leader known and log applied")
			// Restoring a large snapshot left its transient buffers'
			// pages mapped up to the memory limit; give them back once.
			debug.FreeOSMemory()
		}
	}()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx))
	case err := <-serveErr:
		runErr = fmt.Errorf("http server: %w", err)
		log.Error("http server failed; shutting down", "err", err)
	}
	notify.send("STOPPING=1")
	if err := shutdownHTTP(srv, endStreams); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	if err := n.Close(); err != nil {
		log.Error("node close", "err", err)
		runErr = errors.Join(runErr, fmt.Errorf("close node: %w", err))
	}
	log.Info("stopped")
	return runErr
}

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

// orNegative maps a flag's 0 ("no limit") to the -1 that says so to
// api.Options, whose zero value means "the default".
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
