package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
type InprocCluster struct {
	opts InprocOptions
	net  *faultNet
	ids  []string

	raftAddr   []string
	gossipAddr []string
	apiAddr    []string

	disks []*diskfault.Fault // per node, kept across restarts

	mu      sync.Mutex
	nodes   []*inprocNode
	proxies []*frontProxy
	closed  bool
}

type inprocNode struct {
	n    *node.Node
	srv  *http.Server
	logf *os.File
	log  *slog.Logger
	done chan struct{} // closed when srv.Serve returned
}

var _ Cluster = (*InprocCluster)(nil)

// NewInprocCluster starts opts.Nodes nodes forming one cluster and returns
// once every node is ready and the leader's configuration holds all of them
// as voters (or ctx ends).
func NewInprocCluster(ctx context.Context, opts InprocOptions) (*InprocCluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 1 || opts.Nodes > 9 {
		return nil, fmt.Errorf("chaos: %d nodes; want 1-9", opts.Nodes)
	}
	if opts.Dir == "" {
		return nil, errors.New("chaos: InprocOptions.Dir is required")
	}
	if opts.RaftTimeout == 0 {
		opts.RaftTimeout = 400 * time.Millisecond
	}
	if opts.TickPeriod == 0 {
		opts.TickPeriod = 100 * time.Millisecond
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	n := opts.Nodes
	c := &InprocCluster{opts: opts, net: newFaultNet(n), nodes: make([]*inprocNode, n),
		proxies: make([]*frontProxy, n)}
	for range n {
		c.disks = append(c.disks, &diskfault.Fault{})
	}
	ports, err := freePorts(4 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		c.ids = append(c.ids, "n"+strconv.Itoa(i))
		c.raftAddr = append(c.raftAddr, loopback(ports[4*i]))
		c.gossipAddr = append(c.gossipAddr, loopback(ports[4*i+1]))
		c.apiAddr = append(c.apiAddr, loopback(ports[4*i+2]))
	}
	for i := range n {
		p, err := newFrontProxy(c, i, loopback(ports[4*i+3]))
		if err != nil {
			c.Close(context.Background(), true)
			return nil, err
		}
		c.proxies[i] = p
	}
	// Open concurrently: each waits for the others through gossip to form
	// the cluster (bootstrap-expect).
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close(context.Background(), true)
		return nil, err
	}
	if err := c.waitFormed(ctx); err != nil {
		c.Close(context.Background(), true)
		return nil, err
	}
	return c, nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// freePorts picks n ports free for both TCP and UDP on 127.0.0.1, below
// the kernel's ephemeral range (32768 and up on Linux), so that no
// outgoing connection of any process takes one between a kill and a
// restart.
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for try := 0; len(ports) < n && try < 2000; try++ {
		p := 20000 + rand.IntN(12000)
		if seen[p] {
			continue
		}
		seen[p] = true
		l, err := net.Listen("tcp", loopback(p))
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", loopback(p))
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("chaos: found only %d free ports of %d", len(ports), n)
	}
	return ports, nil
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
	if c.opts.Configure != nil {
		c.opts.Configure(i, &cfg)
	}
	return cfg
}

// start opens node i and its HTTP server. The node must not be running.
func (c *InprocCluster) start(i int) error {
	logf, err := os.OpenFile(c.LogPath(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", c.ids[i])
	logger.Info("chaos: starting node")
	n, err := node.Open(c.config(i, logger))
	if err != nil {
		logger.Error("chaos: node did not start", "err", err)
		logf.Close()
		return fmt.Errorf("chaos: start %s: %w", c.ids[i], err)
	}
	l, err := net.Listen("tcp", c.apiAddr[i])
	if err != nil {
		n.Close()
		logf.Close()
		return fmt.Errorf("chaos: %s http: %w", c.ids[i], err)
	}
	h := api.New(api.FromNode(n), api.Options{Logger: logger.With("component", "http"),
		ForwardDial: c.net.forwardDialer(i, c.nodeOf)})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	in := &inprocNode{n: n, srv: srv, logf: logf, log: logger, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		srv.Serve(&faultListener{Listener: l, f: c.net, local: i})
	}()
	c.mu.Lock()
	c.nodes[i] = in
	c.mu.Unlock()
	c.proxies[i].setUp(true)
	return nil
}

// waitFormed waits until every running node is ready and the leader's
// configuration has every node as a voter.
func (c *InprocCluster) waitFormed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if c.formed() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: cluster did not form: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func (c *InprocCluster) formed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, in := range c.nodes {
		if in == nil || in.n.ReadyErr() != nil {
			return false
		}
	}
	for _, in := range c.nodes {
		r := in.n.Raft()
		if r.State() != raft.Leader {
			continue
		}
		f := r.GetConfiguration()
		if f.Error() != nil {
			return false
		}
		voters := 0
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			}
		}
		return voters == len(c.ids)
	}
	return false
}

// Node returns node i's *node.Node while it runs (nil when killed), for
// tests that look inside (Raft state, applied index).
func (c *InprocCluster) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.nodes[i]; in != nil {
		return in.n
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

// Partition cuts the cluster into groups; nodes in no group are alone.
func (c *InprocCluster) Partition(groups [][]int) error {
	group := make([]int, len(c.ids))
	for i := range group {
		group[i] = -1 - i // alone
	}
	for g, members := range groups {
		if err := c.check(members...); err != nil {
			return err
		}
		for _, i := range members {
			group[i] = g
		}
	}
	f := c.net
	f.mu.Lock()
	f.blocked = map[[2]int]bool{}
	for a := range group {
		for b := range group {
			if a != b && group[a] != group[b] {
				f.blocked[[2]int{a, b}] = true
			}
		}
	}
	f.mu.Unlock()
	f.enforce()
	return nil
}

// Block drops traffic from node `from` to node `to`.
func (c *InprocCluster) Block(from, to int) error {
	if err := c.check(from, to); err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("chaos: cannot block node %d from itself", from)
	}
	c.net.mu.Lock()
	c.net.blocked[[2]int{from, to}] = true
	c.net.mu.Unlock()
	c.net.enforce()
	return nil
}

// Loss drops fraction of node i's traffic to peers (see faultnet.go for
// what that means for a stream).
func (c *InprocCluster) Loss(i int, fraction float64) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !(fraction >= 0 && fraction <= 1) {
		return fmt.Errorf("chaos: loss %v outside 0..1", fraction)
	}
	c.net.mu.Lock()
	c.net.loss[i] = fraction
	c.net.mu.Unlock()
	return nil
}

// Delay holds every write and packet node i sends to peers back by d.
func (c *InprocCluster) Delay(i int, d time.Duration) error {
	if err := c.check(i); err != nil {
		return err
	}
	if d < 0 || d > time.Minute {
		return fmt.Errorf("chaos: delay %v outside 0..1m", d)
	}
	c.net.mu.Lock()
	c.net.delay[i] = d
	c.net.mu.Unlock()
	return nil
}

// IsolateClient closes node i's front proxy: clients get connection
// refused, open client connections are cut.
func (c *InprocCluster) IsolateClient(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	return c.proxies[i].setIsolated(true)
}

// Heal removes every partition, block, loss, delay and client isolation.
func (c *InprocCluster) Heal() error {
	f := c.net
	f.mu.Lock()
	f.blocked = map[[2]int]bool{}
	clear(f.loss)
	clear(f.delay)
	f.mu.Unlock()
	var errs []error
	for _, p := range c.proxies {
		errs = append(errs, p.setIsolated(false))
	}
	return errors.Join(errs...)
}

// Kill cuts node i's traffic, then closes it (see InprocCluster: not a
// crash). Killing a dead node does nothing.
func (c *InprocCluster) Kill(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.mu.Lock()
	in := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if in == nil {
		return nil
	}
	// A process dies with its stalled writes; a node closing normally
	// must have them finish first.
	c.disks[i].Set(false, 0)
	c.net.mu.Lock()
	c.net.dead[i] = true
	c.net.mu.Unlock()
	c.net.enforce()
	c.proxies[i].setUp(false)
	in.srv.Close()
	err := in.n.Close()
	<-in.done
	in.log.Info("chaos: node killed")
	in.logf.Close()
	if err != nil && !errors.Is(err, raft.ErrRaftShutdown) {
		return fmt.Errorf("chaos: kill %s: %w", c.ids[i], err)
	}
	return nil
}

// Restart opens a killed node again on the same data directory and
// addresses; it returns once the node runs (not necessarily ready).
func (c *InprocCluster) Restart(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.mu.Lock()
	running, closed := c.nodes[i] != nil, c.closed
	c.mu.Unlock()
	if closed {
		return errors.New("chaos: cluster closed")
	}
	if running {
		return fmt.Errorf("chaos: node %d is running; kill it first", i)
	}
	c.net.mu.Lock()
	c.net.dead[i] = false
	c.net.mu.Unlock()
	if err := c.start(i); err != nil {
		c.net.mu.Lock()
		c.net.dead[i] = true
		c.net.mu.Unlock()
		return err
	}
	return nil
}

// Wipe kills node i and deletes its data directory.
func (c *InprocCluster) Wipe(i int) error {
	if err := c.Kill(i); err != nil {
		return err
	}
	if err := os.RemoveAll(c.DataDir(i)); err != nil {
		return fmt.Errorf("chaos: wipe %s: %w", c.ids[i], err)
	}
	return nil
}

// Pause is not supported in process.
func (c *InprocCluster) Pause(int) error { return ErrUnsupported }

// Resume is not supported in process.
func (c *InprocCluster) Resume(int) error { return ErrUnsupported }

// ClockJump is not supported in process.
func (c *InprocCluster) ClockJump(int, time.Duration) error { return ErrUnsupported }

// ClockRate is not supported in process.
func (c *InprocCluster) ClockRate(int, float64) error { return ErrUnsupported }

// DiskFault stalls or slows node i's Raft store writes (through
// node.Config.WrapRaftStores).
func (c *InprocCluster) DiskFault(i int, stall bool, delay time.Duration) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.disks[i].Set(stall, delay)
	return nil
}

// Alive reports whether node i runs.
func (c *InprocCluster) Alive(i int) bool {
	if c.check(i) != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i] != nil
}

// Close stops every node and front proxy; logs stay, data directories stay
// if keepData.
func (c *InprocCluster) Close(ctx context.Context, keepData bool) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
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

// frontProxy is node i's address for the harness's clients: a TCP relay
// to the node's HTTP server, listening only while the node runs and is not
// isolated from clients.
type frontProxy struct {
	c    *InprocCluster
	i    int
	addr string

	mu       sync.Mutex
	l        net.Listener
	up       bool // the node runs
	isolated bool
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

func newFrontProxy(c *InprocCluster, i int, addr string) (*frontProxy, error) {
	return &frontProxy{c: c, i: i, addr: addr, conns: map[net.Conn]struct{}{}}, nil
}

func (p *frontProxy) setUp(up bool) error {
	p.mu.Lock()
	p.up = up
	p.mu.Unlock()
	return p.sync()
}

func (p *frontProxy) setIsolated(iso bool) error {
	p.mu.Lock()
	p.isolated = iso
	p.mu.Unlock()
	return p.sync()
}

// sync opens or closes the listener to match the state.
func (p *frontProxy) sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	open := p.up && !p.isolated && !p.closed
	switch {
	case open && p.l == nil:
		l, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("chaos: front proxy of %s: %w", p.c.ids[p.i], err)
		}
		p.l = l
		p.wg.Add(1)
		go p.serve(l)
	case !open && p.l != nil:
		p.l.Close()
		p.l = nil
		for cn := range p.conns {
			cn.Close()
		}
	}
	return nil
}

func (p *frontProxy) serve(l net.Listener) {
	defer p.wg.Done()
	for {
		cn, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(cn)
	}
}

func (p *frontProxy) relay(cn net.Conn) {
	defer p.wg.Done()
	up, err := p.c.net.dial(peerClient, p.c.apiAddr[p.i], p.c.nodeOf, func() (net.Conn, error) {
		return net.DialTimeout("tcp", p.c.apiAddr[p.i], 2*time.Second)
	})
	if err != nil {
		cn.Close()
		return
	}
	p.mu.Lock()
	if p.l == nil {
		p.mu.Unlock()
		cn.Close()
		up.Close()
		return
	}
	p.conns[cn], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	// Either side closing ends the relay (HTTP clients do not half-close).
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, cn)
	go pipe(cn, up)
	<-done
	cn.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, cn)
	delete(p.conns, up)
	p.mu.Unlock()
	cn.Close()
	up.Close()
}

func (p *frontProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.sync()
	p.wg.Wait()
}
