//go:build linux

package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// clockFault is a node's chaos fault file (node/clock_chaos.go): its
// clock, and its disk (node/disk_chaos.go).
type clockFault struct {
	WallOffsetNS int64   `json:"wall_offset_ns"`
	MonoRate     float64 `json:"mono_rate"`
	DiskStall    bool    `json:"disk_stall,omitempty"`
	DiskDelayNS  int64   `json:"disk_delay_ns,omitempty"`
}

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

// clusterView is the part of GET /v1/cluster the harness reads.
type clusterView struct {
	NodeID  string `json:"node_id"`
	Leader  string `json:"leader"`
	State   string `json:"state"`
	Members []struct {
		ID     string `json:"id"`
		Voter  bool   `json:"voter"`
		Health string `json:"health"`
	} `json:"members"`
}

var netnsHTTP = &http.Client{Timeout: 3 * time.Second}

// status is node i's own view of the cluster (GET /v1/cluster?stale=true).
func (c *NetnsCluster) status(ctx context.Context, i int) (*clusterView, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.HTTPAddr(i)+"/v1/cluster?stale=true", nil)
	if err != nil {
		return nil, err
	}
	resp, err := netnsHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %d %s", c.NodeID(i), resp.StatusCode, b)
	}
	var v clusterView
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: GET /v1/cluster: %v", c.NodeID(i), err)
	}
	return &v, nil
}

// WaitFormed waits until every node answers /readyz with 200 and sees the
// same leader and all Size() nodes as voters, bounded by ctx (and by 90 s
// if ctx has no deadline). The error says what was missing last.
func (c *NetnsCluster) WaitFormed(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
	}
	var why string
	for {
		why = c.formed(ctx)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: cluster not formed: %s (%w)", why, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		for _, n := range c.nodes {
			if err := n.exited(); err != nil {
				return fmt.Errorf("chaos: %s exited while the cluster formed: %v (log %s)", n.id, err, n.log)
			}
		}
	}
}

func (c *NetnsCluster) formed(ctx context.Context) string {
	leader := ""
	for i := range c.nodes {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.HTTPAddr(i)+"/readyz", nil)
		if err != nil {
			return err.Error()
		}
		resp, err := netnsHTTP.Do(req)
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("%s /readyz %d", c.NodeID(i), resp.StatusCode)
		}
		v, err := c.status(ctx, i)
		if err != nil {
			return err.Error()
		}
		if v.Leader == "" || leader != "" && v.Leader != leader {
			return fmt.Sprintf("%s sees leader %q", c.NodeID(i), v.Leader)
		}
		leader = v.Leader
		voters := 0
		for _, m := range v.Members {
			if m.Voter {
				voters++
			}
		}
		if voters != len(c.nodes) {
			return fmt.Sprintf("%s sees %d voters of %d", c.NodeID(i), voters, len(c.nodes))
		}
	}
	return ""
}

func (c *NetnsCluster) Size() int { return c.opts.Nodes }

// NodeID is node i's --node-id: n<i>, or the id Reidentify gave it.
func (c *NetnsCluster) NodeID(i int) string {
	if i >= 0 && i < len(c.nodes) {
		n := c.nodes[i]
		n.mu.Lock()
		id := n.renamed
		n.mu.Unlock()
		if id != "" {
			return id
		}
	}
	return fmt.Sprintf("n%d", i)
}

func (c *NetnsCluster) HTTPAddr(i int) string { return c.nodeIP(i) + ":" + strconv.Itoa(netnsHTTPPort) }
func (c *NetnsCluster) LogPath(i int) string  { return c.nodes[i].log }
func (c *NetnsCluster) DataDir(i int) string  { return c.nodes[i].data }

func (c *NetnsCluster) node(i int) (*procNode, error) {
	if i < 0 || i >= len(c.nodes) {
		return nil, fmt.Errorf("chaos: node %d: the cluster has nodes 0..%d", i, len(c.nodes)-1)
	}
	return c.nodes[i], nil
}

// Kill sends SIGKILL to node i and waits for it to exit. Killing a node
// that is not running is not an error.
func (c *NetnsCluster) Kill(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("kill", "node", n.id)
	return n.kill()
}

// Restart starts node i again with the same data directory, addresses and
// flags. It is an error if node i is running.
func (c *NetnsCluster) Restart(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("restart", "node", n.id)
	return n.start()
}

// Wipe kills node i and removes its data directory.
func (c *NetnsCluster) Wipe(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("wipe", "node", n.id, "data", n.data)
	if err := n.kill(); err != nil {
		return err
	}
	if n.mounted || n.lazy != nil {
		// A mount point stays; its contents go.
		entries, err := os.ReadDir(n.data)
		if err != nil {
			return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(n.data, e.Name())); err != nil {
				return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
			}
		}
		return nil
	}
	if err := os.RemoveAll(n.data); err != nil {
		return fmt.Errorf("chaos: wipe %s: %w", n.id, err)
	}
	return nil
}

// Pause freezes node i with SIGSTOP.
func (c *NetnsCluster) Pause(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.log.Info("pause", "node", n.id)
	_, err = n.pause(true)
	return err
}

// Resume thaws node i with SIGCONT.
func (c *NetnsCluster) Resume(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	was, err := n.pause(false)
	if was {
		c.log.Info("resume", "node", n.id)
	}
	return err
}

// Alive reports whether node i's process is running (a paused one is).
func (c *NetnsCluster) Alive(i int) bool {
	n, err := c.node(i)
	if err != nil {
		return false
	}
	return n.alive()
}

// ClockJump adds d to node i's wall-clock offset. The binary must be built
// with the `chaos` tag: ErrUnsupported once a node's log shows it started
// without the chaos clock (ClockJump(i, 0) is a cheap probe). While no node
// has got that far, the file is written and nil returned.
func (c *NetnsCluster) ClockJump(i int, d time.Duration) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.WallOffsetNS += int64(d)
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("clock jump", "node", c.NodeID(i), "by", d, "offset", time.Duration(f.WallOffsetNS))
	return nil
}

// ClockRate sets node i's monotonic clock rate (1 is normal; 0.5 to 2 are
// sane, anything not positive is refused). ErrUnsupported as ClockJump.
func (c *NetnsCluster) ClockRate(i int, r float64) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	if !(r > 0) || r > 100 {
		return fmt.Errorf("chaos: clock rate %v: want 0 < r <= 100", r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.MonoRate = r
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("clock rate", "node", c.NodeID(i), "rate", r)
	return nil
}

// DiskFault stalls or slows node i's Raft store writes through its chaos
// fault file (the binary must have the `chaos` tag; ErrUnsupported as
// ClockJump). A node picks a change up within about 20 ms.
func (c *NetnsCluster) DiskFault(i int, stall bool, delay time.Duration) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	if delay < 0 {
		return fmt.Errorf("chaos: disk delay %v: want >= 0", delay)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.clockSupportLocked(); err != nil {
		return err
	}
	f := c.clocks[i]
	f.DiskStall, f.DiskDelayNS = stall, int64(delay)
	if f == c.clocks[i] {
		return nil
	}
	if err := c.writeClockLocked(i, f); err != nil {
		return err
	}
	c.log.Info("disk fault", "node", c.NodeID(i), "stall", stall, "delay", delay)
	return nil
}

// Markers in a node's log: the server's start line, and the warning a
// binary built with the `chaos` tag logs before it when
// LEASEHOLD_CHAOS_CLOCK is set (node/clock_chaos.go).
const (
	serverStartedMarker = "server started"
	chaosClockMarker    = "chaos clock active"
	startHeader         = "==== chaos: starting "
)

// clockSupportLocked returns ErrUnsupported if the binary has no chaos
// clock: some node's log, since its last start, has the server's start
// line without the chaos clock's warning. Undecided (no node has started
// that far) is nil. The answer is kept once known.
func (c *NetnsCluster) clockSupportLocked() error {
	if c.clockKnown {
		if !c.clockOK {
			return fmt.Errorf("chaos: %s was built without the chaos tag (no %q in its logs): %w", c.opts.Binary, chaosClockMarker, ErrUnsupported)
		}
		return nil
	}
	for _, n := range c.nodes {
		b, err := os.ReadFile(n.log)
		if err != nil {
			continue
		}
		if k := bytes.LastIndex(b, []byte(startHeader)); k >= 0 {
			b = b[k:]
		}
		switch {
		case bytes.Contains(b, []byte(chaosClockMarker)):
			c.clockKnown, c.clockOK = true, true
		case bytes.Contains(b, []byte(serverStartedMarker)):
			c.clockKnown, c.clockOK = true, false
		default:
			continue
		}
		return c.clockSupportLocked()
	}
	return nil
}

// writeClockLocked writes node i's clock file atomically (temp + rename).
func (c *NetnsCluster) writeClockLocked(i int, f clockFault) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	path := c.nodes[i].clock
	tmp, err := os.CreateTemp(filepath.Dir(path), ".clock-*")
	if err != nil {
		return fmt.Errorf("chaos: clock file: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("chaos: clock file: %w", werr)
	}
	c.clocks[i] = f
	return nil
}

// ClockPath is node i's clock fault file (LEASEHOLD_CHAOS_CLOCK).
func (c *NetnsCluster) ClockPath(i int) string { return c.nodes[i].clock }

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
