//go:build linux

package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The real-process tier. Every node is a `leasehold server` process in its
// own network namespace; all namespaces hang off one bridge that lives in a
// "hub" namespace of the run (not in the root namespace: with Docker
// installed, br_netfilter sends bridged frames through the root namespace's
// iptables FORWARD chain, whose policy is drop). The harness reaches the
// bridge through a veth pair whose root end carries the harness address.
//
//	root ns:  lhc<run>h 10.77.K.254 (harness), 10.77.K.253 (delay proxies)
//	   |
//	lhc<run>hub ns: bridge br0 -- h0, v0, v1, ...
//	   |
//	lhc<run>n<i> ns: eth0 10.77.K.<i+1>, nftables table inet lhc<run>
//
// Every name starts with lhc<run>, so Cleanup finds the leftovers of a run
// that died without Close.

// Ports every node listens on, on its namespace's address.
const (
	netnsHTTPPort   = 7700
	netnsRaftPort   = 7701
	netnsGossipPort = 7702
	// Delay proxies listen on the proxy address at netnsProxyBase +
	// from*netnsMaxNodes + to.
	netnsProxyBase = 17800
	netnsMaxNodes  = 9
)

// netnsPrefix starts every name (namespace, link, nftables table, state
// file) a netns cluster creates.
const netnsPrefix = "lhc"

var runIDRe = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// NetnsCluster is a Cluster of real server processes in network namespaces.
// It needs root, iproute2 (`ip`) and nftables (`nft`).
type NetnsCluster struct {
	opts    NetnsOptions
	log     *slog.Logger
	prefix  string // lhc<run>
	subnet  int    // K in 10.77.K.0/24
	harness string // harness address
	proxyIP string // delay proxies' address
	nodes   []*procNode
	state   string // state file path

	mu     sync.Mutex // fault state, nft rules, proxies, clocks
	faults faultState
	rules  []string // last ruleset applied per node
	clocks []clockFault
	// clockKnown: whether the binary has the chaos clock (clockOK) is known.
	clockKnown, clockOK bool
	proxy               *delayProxies
	spawnr              *spawner
	logf                *os.File // the harness log Close closes, if the cluster opened it
	lazyRoot            string   // the shared mount that holds the lazy disks (LazyDisk)

	closeOnce sync.Once
	closeErr  error
}

var _ Cluster = (*NetnsCluster)(nil)

func (o *NetnsOptions) setDefaults() error {
	o.Nodes = cmp.Or(o.Nodes, 5)
	if o.Nodes < 1 || o.Nodes > netnsMaxNodes {
		return fmt.Errorf("chaos: Nodes %d: want 1 to %d", o.Nodes, netnsMaxNodes)
	}
	if o.Binary == "" {
		return errors.New("chaos: Binary is required")
	}
	abs, err := filepath.Abs(o.Binary)
	if err != nil {
		return fmt.Errorf("chaos: Binary: %w", err)
	}
	o.Binary = abs
	if fi, err := os.Stat(o.Binary); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("chaos: Binary %s is not an executable file (%v)", o.Binary, err)
	}
	if o.Dir == "" {
		return errors.New("chaos: Dir is required")
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return fmt.Errorf("chaos: Dir: %w", err)
	}
	if o.RunID == "" {
		o.RunID = randomRunID()
	}
	if !runIDRe.MatchString(o.RunID) {
		return fmt.Errorf("chaos: RunID %q: want 1 to 8 characters of [a-z0-9]", o.RunID)
	}
	for _, e := range o.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("chaos: Env entry %q: want KEY=VALUE", e)
		}
	}
	if o.LazyDisk && o.DiskSize > 0 {
		return errors.New("chaos: LazyDisk and DiskSize cannot be combined")
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 90 * time.Second
	}
	return nil
}

// NewNetnsCluster cleans up the leftovers of earlier runs (Cleanup), builds
// the network, starts o.Nodes servers and returns once every one is ready
// and sees a cluster of o.Nodes voters with a leader. On error everything it
// created is removed again (logs are kept).
func NewNetnsCluster(ctx context.Context, o NetnsOptions) (*NetnsCluster, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	if err := checkNetnsTools(); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "data", "clock"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
	}
	var harnessLog *os.File
	if o.Logger == nil {
		f, err := os.OpenFile(filepath.Join(o.Dir, "logs", "harness.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		harnessLog = f
		o.Logger = slog.New(slog.NewTextHandler(f, nil))
	}
	if err := Cleanup(ctx, o.Logger); err != nil {
		if harnessLog != nil {
			harnessLog.Close()
		}
		return nil, fmt.Errorf("chaos: cleanup of earlier runs: %w", err)
	}
	c := &NetnsCluster{
		opts:   o,
		prefix: netnsPrefix + o.RunID,
		rules:  make([]string, o.Nodes),
		clocks: make([]clockFault, o.Nodes),
		faults: newFaultState(o.Nodes),
		logf:   harnessLog,
	}
	c.log = o.Logger.With("run", o.RunID)
	for i := range c.clocks {
		c.clocks[i].MonoRate = 1
	}
	state, subnet, err := claimRun(c.prefix)
	if err != nil {
		if harnessLog != nil {
			harnessLog.Close()
		}
		return nil, err
	}
	c.state, c.subnet = state, subnet
	c.harness = fmt.Sprintf("10.77.%d.254", subnet)
	c.proxyIP = fmt.Sprintf("10.77.%d.253", subnet)
	c.proxy = newDelayProxies(c)
	c.spawnr = newSpawner()

	ok := false
	defer func() {
		if !ok {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			c.Close(cctx, true)
		}
	}()
	if err := c.buildNetwork(ctx); err != nil {
		return nil, err
	}
	for i := range o.Nodes {
		n := &procNode{
			c:     c,
			i:     i,
			ns:    c.Namespace(i),
			id:    c.NodeID(i),
			addr:  c.nodeIP(i),
			log:   filepath.Join(o.Dir, "logs", fmt.Sprintf("n%d.log", i)),
			data:  filepath.Join(o.Dir, "data", fmt.Sprintf("n%d", i)),
			clock: filepath.Join(o.Dir, "clock", fmt.Sprintf("n%d.json", i)),
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.mountDisks(); err != nil {
		return nil, err
	}
	if err := c.mountLazy(); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	if err := c.WaitFormed(wctx); err != nil {
		return nil, err
	}
	c.log.Info("netns cluster up", "nodes", o.Nodes, "subnet", fmt.Sprintf("10.77.%d.0/24", subnet), "dir", o.Dir)
	ok = true
	return c, nil
}

func (c *NetnsCluster) spawn(cmd *exec.Cmd) error { return c.spawnr.start(cmd) }

// checkNetnsTools reports what the real-process tier lacks to run here.
func checkNetnsTools() error {
	if os.Geteuid() != 0 {
		return errors.New("chaos: the netns cluster needs root (network namespaces, nftables)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := lookPath(tool); err != nil {
			return fmt.Errorf("chaos: the netns cluster needs %q (apt-get install iproute2 nftables): %w", tool, err)
		}
	}
	return nil
}

// Namespace is node i's network namespace (its name under /run/netns).
func (c *NetnsCluster) Namespace(i int) string { return fmt.Sprintf("%sn%d", c.prefix, i) }

func (c *NetnsCluster) hubNamespace() string { return c.prefix + "hub" }
func (c *NetnsCluster) harnessLink() string  { return c.prefix + "h" }
func (c *NetnsCluster) nodeIP(i int) string  { return fmt.Sprintf("10.77.%d.%d", c.subnet, i+1) }
func (c *NetnsCluster) tableName() string    { return c.prefix }

// HarnessAddr is the address the harness's clients reach the nodes from.
func (c *NetnsCluster) HarnessAddr() string { return c.harness }

// buildNetwork creates the hub namespace with its bridge, the harness's
// veth pair and one namespace per node with its veth into the bridge.
func (c *NetnsCluster) buildNetwork(ctx context.Context) error {
	hub := c.hubNamespace()
	cmds := [][]string{
		{"ip", "netns", "add", hub},
		{"ip", "-n", hub, "link", "set", "lo", "up"},
		{"ip", "-n", hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", hub, "link", "set", "br0", "up"},
		{"ip", "link", "add", c.harnessLink(), "type", "veth", "peer", "name", "h0", "netns", hub},
		{"ip", "-n", hub, "link", "set", "h0", "master", "br0", "up"},
		{"ip", "addr", "add", c.harness + "/24", "dev", c.harnessLink()},
		{"ip", "addr", "add", c.proxyIP + "/24", "dev", c.harnessLink()},
		{"ip", "link", "set", c.harnessLink(), "up"},
	}
	for i := range c.opts.Nodes {
		ns := c.Namespace(i)
		v := fmt.Sprintf("v%d", i)
		cmds = append(cmds,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", hub, "link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", hub, "link", "set", v, "master", "br0", "up"},
			[]string{"ip", "-n", ns, "addr", "add", c.nodeIP(i) + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
		)
	}
	for _, args := range cmds {
		if err := run(ctx, nil, args...); err != nil {
			return err
		}
	}
	// An empty table in every node namespace from the start, so that every
	// fault later is one atomic replacement of it.
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applyRulesLocked(ctx)
}

// Close stops every node (SIGTERM, then SIGKILL after 5 s), stops the delay
// proxies and removes the namespaces, links, nftables tables, clock files
// and the run's state file; it keeps the logs and, if keepData, the data
// directories. It waits until the kernel has removed the links (bounded by
// ctx). Calling it again returns the first result.
func (c *NetnsCluster) Close(ctx context.Context, keepData bool) error {
	c.closeOnce.Do(func() { c.closeErr = c.close(ctx, keepData) })
	return c.closeErr
}

func (c *NetnsCluster) close(ctx context.Context, keepData bool) error {
	var errs []error
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.stop(5 * time.Second)
		}()
	}
	wg.Wait()
	c.spawnr.stop()
	c.mu.Lock()
	if c.proxy != nil {
		c.proxy.closeAll()
	}
	c.mu.Unlock()
	if err := removeRun(ctx, c.prefix, c.opts.Nodes); err != nil {
		errs = append(errs, err)
	}
	if c.state != "" {
		if err := os.Remove(c.state); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(c.opts.Dir, "clock")); err != nil {
		errs = append(errs, err)
	}
	if err := c.unmountDisks(); err != nil {
		errs = append(errs, err)
	}
	if err := c.unmountLazy(); err != nil {
		errs = append(errs, err)
	}
	if !keepData {
		if err := os.RemoveAll(filepath.Join(c.opts.Dir, "data")); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	c.log.Info("netns cluster closed", "keep_data", keepData, "err", err)
	if c.logf != nil {
		c.logf.Close()
	}
	return err
}
