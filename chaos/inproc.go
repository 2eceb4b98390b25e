package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/internal/diskfault"
	"github.com/leasehold/leasehold/internal/harness"
	"github.com/leasehold/leasehold/node"
)

// InprocOptions configure NewInprocCluster.
type InprocOptions struct {
	// Nodes is the cluster size. Default 3.
	Nodes int
	// Dir holds data/nI (data directories) and logs/nI.log. Required.
	Dir string
	// RaftTimeout is Raft's heartbeat and election timeout. Default 400ms
	// (quick failover, yet no lost leaders under -race on a loaded 2-core
	// machine).
	RaftTimeout time.Duration
	// TickPeriod is the cluster clock's period. Default 100ms.
	TickPeriod time.Duration
	// FastGossip shortens gossip's probes to 100ms (50ms timeout): failures
	// are seen sooner, but a Delay above 50ms makes the delayed node flap
	// in gossip. Default off: the server's own gossip timing (500ms probes).
	FastGossip bool
	// Configure, if set, adjusts node i's configuration after the cluster
	// has filled it in (ids, addresses, data directory, network hooks);
	// it is applied again on every restart.
	Configure func(i int, cfg *node.Config)
}

// InprocCluster is a Cluster of in-process nodes (package node, served by
// package api) on loopback, for the fast tier that runs under
// `go test -race`.
//
// Every node listens on 127.0.0.1 (Raft over TCP, gossip over UDP and TCP,
// HTTP), and all traffic between nodes goes through fault-injecting
// wrappers installed with node.Config's WrapRaftStream and WrapGossip and
// api.Options' ForwardDial (faultnet.go explains what each fault does to a
// stream and to a packet). The harness's clients reach node i through a
// front proxy at HTTPAddr(i), stable across restarts; IsolateClient closes
// it, so that clients get "connection refused" as from a dead server.
//
// Kill is not a crash: the node's traffic is cut first (the others see it
// vanish at once, as after SIGKILL), then the node is closed normally, so
// everything it acknowledged is on disk and nothing half-written is left.
// A real crash is the netns tier's job. Pause, Resume, ClockJump and
// ClockRate are not supported (ErrUnsupported).
//
// The nodes' lifecycle (start, stop, waiting for the cluster to form) is
// internal/harness's, as for every package's cluster tests; this type adds
// the fault injection and the front proxies.
type InprocCluster struct {
	opts InprocOptions
	net  *faultNet
	ids  []string

	raftAddr   []string
	gossipAddr []string
	apiAddr    []string

	disks []*diskfault.Fault // per node, kept across restarts
	msgs  *msgFaults         // Raft messages copied and delayed (raftmsg.go)

	h       *harness.Cluster[int, *inprocNode] // configured by node index
	proxies []*frontProxy

	mu     sync.Mutex
	closed bool
}

// inprocNode is a running node with its HTTP server and log file.
type inprocNode struct {
	*node.Node
	srv  *http.Server
	logf *os.File
	log  *slog.Logger
	done chan struct{} // closed when srv.Serve returned
}

// Close closes the HTTP server, then the node (the harness's Stop calls
// it).
func (in *inprocNode) Close() error {
	in.srv.Close()
	err := in.Node.Close()
	<-in.done
	in.log.Info("chaos: node killed")
	in.logf.Close()
	return err
}

var _ Cluster = (*InprocCluster)(nil)

// NewInprocCluster starts opts.Nodes nodes forming one cluster and returns
// once every node is ready and the leader's configuration holds all of them
// as voters (or ctx ends).
func NewInprocCluster(ctx context.Context, opts InprocOptions) (*InprocCluster, error) {
	opts.Nodes = cmp.Or(opts.Nodes, 3)
	if opts.Nodes < 1 || opts.Nodes > 9 {
		return nil, fmt.Errorf("chaos: %d nodes; want 1-9", opts.Nodes)
	}
	if opts.Dir == "" {
		return nil, errors.New("chaos: InprocOptions.Dir is required")
	}
	opts.RaftTimeout = cmp.Or(opts.RaftTimeout, 400*time.Millisecond)
	opts.TickPeriod = cmp.Or(opts.TickPeriod, 100*time.Millisecond)
	if err := os.MkdirAll(filepath.Join(opts.Dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	n := opts.Nodes
	c := &InprocCluster{opts: opts, net: newFaultNet(n), proxies: make([]*frontProxy, n), msgs: newMsgFaults()}
	c.h = harness.New(harness.Options[int, *inprocNode]{Open: c.open})
	for range n {
		c.disks = append(c.disks, &diskfault.Fault{})
	}
	addrs, err := harness.FreeAddrs(4 * n)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	for i := range n {
		c.ids = append(c.ids, "n"+strconv.Itoa(i))
		c.raftAddr = append(c.raftAddr, addrs[4*i])
		c.gossipAddr = append(c.gossipAddr, addrs[4*i+1])
		c.apiAddr = append(c.apiAddr, addrs[4*i+2])
	}
	for i := range n {
		p, err := newFrontProxy(c, i, addrs[4*i+3])
		if err != nil {
			c.Close(context.Background(), true)
			return nil, err
		}
		c.proxies[i] = p
	}
	// Opened concurrently: each waits for the others through gossip to
	// form the cluster (bootstrap-expect).
	if _, err := c.h.StartAll(c.indexes()...); err != nil {
		c.Close(context.Background(), true)
		return nil, err
	}
	// Every node ready, and the leader's configuration has every node as
	// a voter.
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := c.h.WaitVoters(fctx, n); err != nil {
		c.Close(context.Background(), true)
		return nil, fmt.Errorf("chaos: cluster did not form: %w", err)
	}
	if err := c.h.WaitReady(fctx); err != nil {
		c.Close(context.Background(), true)
		return nil, fmt.Errorf("chaos: cluster did not form: %w", err)
	}
	return c, nil
}

func (c *InprocCluster) indexes() []int {
	is := make([]int, len(c.ids))
	for i := range is {
		is[i] = i
	}
	return is
}

// nodeOf names the node one of whose addresses addr is.
func (c *InprocCluster) nodeOf(addr string) int {
	for i := range c.ids {
		if addr == c.raftAddr[i] || addr == c.gossipAddr[i] || addr == c.apiAddr[i] {
			return i
		}
	}
	return peerUnknown
}

func (c *InprocCluster) config(i int, logger *slog.Logger) node.Config {
	cfg := node.DefaultConfig()
	cfg.NodeID = c.ids[i]
	cfg.DataDir = c.DataDir(i)
	cfg.RaftAddr = c.raftAddr[i]
	cfg.GossipAddr = c.gossipAddr[i]
	cfg.HTTPAddr = c.apiAddr[i]
	cfg.BootstrapExpect = len(c.ids)
	cfg.Join = append([]string(nil), c.gossipAddr...)
	cfg.JoinTimeout = 20 * time.Second
	cfg.StabilizationTime = 500 * time.Millisecond
	cfg.TickPeriod = c.opts.TickPeriod
	cfg.RaftTimeout = c.opts.RaftTimeout
	cfg.FastGossip = c.opts.FastGossip
	cfg.Logger = logger
	cfg.WrapRaftStream = func(s raft.StreamLayer) raft.StreamLayer {
		return &raftStream{StreamLayer: s, f: c.net, local: i, nodeOf: c.nodeOf}
	}
	cfg.WrapGossip = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		return newGossipTransport(t, c.net, i, c.nodeOf)
	}
	cfg.WrapRaftStores = c.disks[i].Wrap
	cfg.WrapRaftTransport = c.msgs.wrap
	if c.opts.Configure != nil {
		c.opts.Configure(i, &cfg)
	}
	return cfg
}

// open opens node i and its HTTP server, and opens its front proxy (the
// harness's Options.Open). The node must not be running.
func (c *InprocCluster) open(i int, logs io.Writer) (*inprocNode, error) {
	logf, err := os.OpenFile(c.LogPath(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logf, logs), &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.ids[i])
	logger.Info("chaos: starting node")
	n, err := node.Open(c.config(i, logger))
	if err != nil {
		logger.Error("chaos: node did not start", "err", err)
		logf.Close()
		return nil, fmt.Errorf("chaos: start %s: %w", c.ids[i], err)
	}
	l, err := net.Listen("tcp", c.apiAddr[i])
	if err != nil {
		n.Close()
		logf.Close()
		return nil, fmt.Errorf("chaos: %s http: %w", c.ids[i], err)
	}
	h := api.New(api.FromNode(n), api.Options{Logger: logger.With("component", "http"),
		ForwardDial: c.net.forwardDialer(i, c.nodeOf)})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	in := &inprocNode{Node: n, srv: srv, logf: logf, log: logger, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		srv.Serve(&faultListener{Listener: l, f: c.net, local: i})
	}()
	c.proxies[i].setUp(true)
	return in, nil
}

// Node returns node i's *node.Node while it runs (nil when killed), for
// tests that look inside (Raft state, applied index).
func (c *InprocCluster) Node(i int) *node.Node {
	if in, ok := c.h.Server(c.ids[i]); ok {
		return in.Node
	}
	return nil
}

func (c *InprocCluster) Size() int             { return len(c.ids) }
func (c *InprocCluster) NodeID(i int) string   { return c.ids[i] }
func (c *InprocCluster) HTTPAddr(i int) string { return c.proxies[i].addr }
func (c *InprocCluster) LogPath(i int) string {
	return filepath.Join(c.opts.Dir, "logs", c.ids[i]+".log")
}
func (c *InprocCluster) DataDir(i int) string {
	return filepath.Join(c.opts.Dir, "data", c.ids[i])
}

func (c *InprocCluster) check(is ...int) error {
	for _, i := range is {
		if i < 0 || i >= len(c.ids) {
			return fmt.Errorf("chaos: no node %d in a cluster of %d", i, len(c.ids))
		}
	}
	return nil
}

// Close stops every node and front proxy; logs stay, data directories stay
// if keepData.
func (c *InprocCluster) Close(ctx context.Context, keepData bool) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.msgs.set(0, 0, 0)
	defer c.msgs.wg.Wait() // late copies of Raft messages (they fail once the nodes are closed)
	errs := make([]error, len(c.ids))
	var wg sync.WaitGroup
	for i := range c.ids {
		wg.Go(func() { errs[i] = c.Kill(i) })
	}
	wg.Wait()
	for _, p := range c.proxies {
		if p != nil {
			p.close()
		}
	}
	if !keepData {
		errs = append(errs, os.RemoveAll(filepath.Join(c.opts.Dir, "data")))
	}
	return errors.Join(errs...)
}
