// Package harness runs a cluster of Leasehold servers in one process. It is
// the one implementation behind node's cluster tests, internal/testcluster
// (the api and recipe tests) and the chaos suite's in-process tier: start
// servers (each from its own configuration), connect and cut their Raft
// traffic, stop and start them again, wait for one ready leader or for a
// number of voters, and keep their last log lines for a failure report.
//
// It imports neither node (node's own tests use it: the caller says how to
// open a server, and *node.Node is a Server) nor testing (the chaos tier
// runs it from a binary): it returns errors, and the tests' wrappers fail
// the test.
package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
)

// Server is what the harness needs of a running server; *node.Node has it
// all, and a caller's type that embeds one (with an API server in front,
// say) has it too.
type Server interface {
	NodeID() string
	// Cluster is the server's Raft: state, leader, configuration, and the
	// transport the harness connects when it is in memory.
	Cluster() *cluster.Cluster
	// ReadyErr is nil when the server serves (a leader known, caught up).
	ReadyErr() error
	Close() error
}

// Options configure New.
type Options[C any, S Server] struct {
	// Open starts a server from its configuration. logs keeps the
	// cluster's last log lines (Tail): the server's logger should write
	// there (alone or beside a file). Open may be called concurrently
	// (StartAll).
	Open func(cfg C, logs io.Writer) (S, error)
	// Ready, if set, is what WaitReady waits for of every server, in place
	// of ReadyErr.
	Ready func(S) error
	// TailLines is how many log lines Tail keeps. Default 400.
	TailLines int
}

// ErrNotRunning is returned by Stop for a server that is not running.
var ErrNotRunning = errors.New("harness: server not running")

// poll is how often the Wait methods look.
const poll = 5 * time.Millisecond

// Cluster is a set of running servers, by id.
//
// Raft traffic: servers whose transport is in memory (raft.WithPeers, as
// node's InMemory configuration gives) are connected with every other such
// server when they start, except for the pairs Isolate cut; servers on TCP
// dial each other, and cutting their traffic is the caller's business (the
// chaos tier's fault-injecting streams).
type Cluster[C any, S Server] struct {
	opts Options[C, S]
	tail *tail

	mu      sync.Mutex
	servers map[string]S
	links   map[string]inmem
	cut     map[[2]string]bool
}

type inmem interface {
	raft.Transport
	raft.WithPeers
}

// New returns an empty cluster.
func New[C any, S Server](opts Options[C, S]) *Cluster[C, S] {
	opts.TailLines = cmp.Or(opts.TailLines, 400)
	return &Cluster[C, S]{opts: opts, tail: &tail{max: opts.TailLines},
		servers: map[string]S{}, links: map[string]inmem{}, cut: map[[2]string]bool{}}
}

// Start opens a server (again, after Stop, for a restart) and connects its
// in-memory transport with the others'.
func (c *Cluster[C, S]) Start(cfg C) (S, error) {
	var zero S
	s, err := c.opts.Open(cfg, c.tail)
	if err != nil {
		return zero, err
	}
	id := s.NodeID()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.servers[id]; dup {
		s.Close()
		return zero, fmt.Errorf("harness: a server %s is running already", id)
	}
	c.servers[id] = s
	if tr, ok := s.Cluster().Transport().(inmem); ok {
		for oid, ot := range c.links {
			if !c.cut[[2]string{id, oid}] {
				tr.Connect(ot.LocalAddr(), ot)
				ot.Connect(tr.LocalAddr(), tr)
			}
		}
		c.links[id] = tr
	}
	return s, nil
}

// StartAll starts servers concurrently (bootstrap-expect: each waits for
// the others to open) and returns them in the order of cfgs; on an error,
// the ones that started run on (Close stops them).
func (c *Cluster[C, S]) StartAll(cfgs ...C) ([]S, error) {
	out := make([]S, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { out[i], errs[i] = c.Start(cfg) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Stop cuts a server's in-memory links, then closes it: a crash, as far as
// the others can tell (Raft stops answering). Its Close error is returned.
func (c *Cluster[C, S]) Stop(id string) error {
	c.mu.Lock()
	s, ok := c.servers[id]
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNotRunning, id)
	}
	delete(c.servers, id)
	tr := c.links[id]
	delete(c.links, id)
	if tr != nil {
		for _, ot := range c.links {
			ot.Disconnect(tr.LocalAddr())
		}
	}
	c.mu.Unlock()
	if tr != nil {
		tr.DisconnectAll()
	}
	return s.Close()
}

// Server returns the running server id (false, and the zero S, when it
// does not run).
func (c *Cluster[C, S]) Server(id string) (S, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.servers[id]
	return s, ok
}

// Isolate cuts the in-memory Raft traffic between id and every other
// server, until Heal.
func (c *Cluster[C, S]) Isolate(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	tr, ok := c.links[id]
	if !ok {
		return fmt.Errorf("harness: no in-memory transport for %s", id)
	}
	for oid, ot := range c.links {
		if oid == id {
			continue
		}
		c.cut[[2]string{id, oid}], c.cut[[2]string{oid, id}] = true, true
		ot.Disconnect(tr.LocalAddr())
		tr.Disconnect(ot.LocalAddr())
	}
	return nil
}

// Heal connects every pair of in-memory transports again.
func (c *Cluster[C, S]) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.cut)
	for id, tr := range c.links {
		for oid, ot := range c.links {
			if id != oid {
				tr.Connect(ot.LocalAddr(), ot)
			}
		}
	}
}

// running returns the running servers but the excluded ones, by id.
func (c *Cluster[C, S]) running(exclude []string) []S {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []S
	for id, s := range c.servers {
		if !slices.Contains(exclude, id) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b S) int { return strings.Compare(a.NodeID(), b.NodeID()) })
	return out
}

// view describes a server for a report.
func view[S Server](s S) string {
	cl := s.Cluster()
	_, lid := cl.Leader()
	return fmt.Sprintf("%s: %v term %d leader %q ready %v applied %d", s.NodeID(), cl.State(), cl.Term(),
		lid, s.ReadyErr(), cl.AppliedIndex())
}

// leader returns the one ready leader among the running servers but the
// excluded ones, or an error saying what each server sees.
func (c *Cluster[C, S]) leader(exclude []string) (S, error) {
	var l S
	k := 0
	ss := c.running(exclude)
	for _, s := range ss {
		if s.Cluster().State() == cluster.Leader && s.ReadyErr() == nil {
			l, k = s, k+1
		}
	}
	if k == 1 {
		return l, nil
	}
	views := make([]string, len(ss))
	for i, s := range ss {
		views[i] = view(s)
	}
	var zero S
	return zero, fmt.Errorf("%d ready leaders: %s", k, strings.Join(views, "; "))
}

// WaitLeader waits for exactly one ready leader (Raft leader, ReadyErr nil)
// among the running servers but the excluded ones, and returns it.
func (c *Cluster[C, S]) WaitLeader(ctx context.Context, exclude ...string) (S, error) {
	var l S
	err := until(ctx, "a single ready leader", func() (err error) {
		l, err = c.leader(exclude)
		return err
	})
	return l, err
}

// WaitVoters waits until the one ready leader's configuration has n
// voters, and each of them running knows all n as voters.
func (c *Cluster[C, S]) WaitVoters(ctx context.Context, n int) error {
	return until(ctx, fmt.Sprintf("%d voters", n), func() error {
		l, err := c.leader(nil)
		if err != nil {
			return err
		}
		conf, err := l.Cluster().Configuration()
		if err != nil {
			return fmt.Errorf("%s's configuration: %w", l.NodeID(), err)
		}
		voters := map[string]bool{}
		for _, s := range conf.Servers {
			if s.Voter {
				voters[s.ID] = true
			}
		}
		if len(voters) != n {
			return fmt.Errorf("leader %s has %d voters: %+v", l.NodeID(), len(voters), conf.Servers)
		}
		// Every running voter must know them as voters too: one that has
		// not yet seen another's promotion refuses it its vote
		// (hashicorp/raft asks a candidate to be a voter in the
		// receiver's configuration), so a test stopping the leader at
		// once could leave the other two unable to elect (a CI run saw
		// n2 campaign for 20 s against n3's older configuration). A
		// removed server still running may keep its old configuration.
		for _, s := range c.running(nil) {
			if !voters[s.NodeID()] {
				continue
			}
			sc, err := s.Cluster().Configuration()
			if err != nil {
				return fmt.Errorf("%s's configuration: %w", s.NodeID(), err)
			}
			v := 0
			for _, m := range sc.Servers {
				if m.Voter {
					v++
				}
			}
			if v != n {
				return fmt.Errorf("%s knows %d voters: %+v", s.NodeID(), v, sc.Servers)
			}
		}
		return nil
	})
}

// WaitReady waits until every running server is ready (Options.Ready, or
// ReadyErr).
func (c *Cluster[C, S]) WaitReady(ctx context.Context) error {
	return until(ctx, "every server ready", func() error {
		var errs []error
		for _, s := range c.running(nil) {
			err := s.ReadyErr()
			if c.opts.Ready != nil {
				err = c.opts.Ready(s)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.NodeID(), err))
			}
		}
		return errors.Join(errs...)
	})
}

// until polls check until it returns nil; when ctx ends first, it returns
// check's last error.
func until(ctx context.Context, what string, check func() error) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: waiting for %s: %v: %w", what, context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// Tail returns the servers' last log lines (Options.TailLines).
func (c *Cluster[C, S]) Tail() string { return c.tail.String() }

// Close stops every running server, one after the other, the leader
// first, and cuts in-memory links as it goes: the others' to each server
// before it closes, and the leader's own (its hand-off then fails at once:
// the cluster is going away whole). An RPC to a server whose Raft has
// stopped is never answered and waits out the transport's timeout (two
// seconds or more) in a goroutine the next server's Raft shutdown waits
// for, and a leader left alone cannot hand leadership on until its lease
// runs out; a cut link fails at once. Closing three in-memory nodes took
// 4-5 s, now about 0.1 s. Servers on TCP have no links to cut: their
// leader, closed first, hands leadership on as in a graceful stop.
func (c *Cluster[C, S]) Close() error {
	c.mu.Lock()
	ss := slices.Collect(maps.Values(c.servers))
	links := c.links
	c.servers, c.links = map[string]S{}, map[string]inmem{}
	c.mu.Unlock()
	if i := slices.IndexFunc(ss, func(s S) bool { return s.Cluster().IsLeader() }); i >= 0 {
		ss[0], ss[i] = ss[i], ss[0]
	}
	var errs []error
	for k, s := range ss {
		if tr := links[s.NodeID()]; tr != nil {
			delete(links, s.NodeID())
			for _, ot := range links {
				ot.Disconnect(tr.LocalAddr())
			}
			if k == 0 {
				tr.DisconnectAll()
			}
		}
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

var (
	givenMu sync.Mutex
	given   = map[int]bool{} // ports FreeAddrs picked (or found busy) in this process
)

// FreeAddrs picks n distinct ports on 127.0.0.1 free for both TCP and UDP
// (gossip uses both), below the kernel's ephemeral range (32768 and up on
// Linux), so that no outgoing connection of any process takes one between
// the pick and the listen, or between a stop and a restart. A port is
// handed out once per process: clusters running side by side (parallel
// tests) never get a port another one holds while its server is stopped.
func FreeAddrs(n int) ([]string, error) {
	givenMu.Lock()
	defer givenMu.Unlock()
	var addrs []string
	for try := 0; len(addrs) < n && try < 2000; try++ {
		p := 20000 + rand.IntN(12000)
		if given[p] {
			continue
		}
		given[p] = true
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		addrs = append(addrs, addr)
	}
	if len(addrs) < n {
		return nil, fmt.Errorf("harness: found only %d free loopback ports of %d", len(addrs), n)
	}
	return addrs, nil
}

// tail keeps the last max lines written to it.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (b *tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		b.lines = append(b.lines, l)
	}
	if over := len(b.lines) - b.max; over > 0 {
		b.lines = append(b.lines[:0], b.lines[over:]...)
	}
	return len(p), nil
}

func (b *tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}
