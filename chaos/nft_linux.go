package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// faultTimeout bounds applying one fault to every namespace.
const faultTimeout = 30 * time.Second

func (c *NetnsCluster) addrs() nftAddrs {
	a := nftAddrs{harness: c.harness, proxy: c.proxyIP, raftPort: netnsRaftPort, gossipPort: netnsGossipPort, httpPort: netnsHTTPPort,
		proxyFor: proxyPort}
	for i := range c.opts.Nodes {
		a.nodes = append(a.nodes, c.nodeIP(i))
	}
	return a
}

func proxyPort(a, b int) int { return netnsProxyBase + a*netnsMaxNodes + b }

// applyRulesLocked renders every node's table from c.faults and replaces
// the tables that changed, each in one nft transaction, all namespaces at
// once (so that a partition comes into force nearly together everywhere).
func (c *NetnsCluster) applyRulesLocked(ctx context.Context) error {
	a := c.addrs()
	errs := make([]error, c.opts.Nodes)
	var wg sync.WaitGroup
	for i := range c.opts.Nodes {
		script := c.faults.render(c.tableName(), i, a)
		if script == c.rules[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx, strings.NewReader(script), "ip", "netns", "exec", c.Namespace(i), "nft", "-f", "-"); err != nil {
				errs[i] = fmt.Errorf("%s: %w", c.NodeID(i), err)
				c.rules[i] = "" // unknown: rewrite next time
				return
			}
			c.rules[i] = script
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// changeFaults applies change to the fault state, then the rules and the
// delay proxies. If change fails nothing changes.
func (c *NetnsCluster) changeFaults(what string, change func(f *faultState) error, attrs ...any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := newFaultState(c.opts.Nodes)
	copyFaults(&next, &c.faults)
	if err := change(&next); err != nil {
		return err
	}
	c.faults = next
	ctx, cancel := context.WithTimeout(context.Background(), faultTimeout)
	defer cancel()
	start := time.Now()
	// Proxies first: a redirect must find its listener.
	err := c.proxy.sync(&c.faults)
	err = errors.Join(err, c.applyRulesLocked(ctx))
	c.proxy.prune(&c.faults)
	c.log.Info(what, append(attrs, "took", time.Since(start).Round(time.Millisecond), "err", err)...)
	return err
}

func copyFaults(dst, src *faultState) {
	for i := range src.n {
		copy(dst.cut[i], src.cut[i])
	}
	for i := range src.n {
		copy(dst.protoCut[i], src.protoCut[i])
		copy(dst.rate[i], src.rate[i])
	}
	copy(dst.isolated, src.isolated)
	copy(dst.loss, src.loss)
	copy(dst.delay, src.delay)
}

// Partition cuts the cluster into groups (see Cluster). It replaces any
// earlier partition and one-way blocks; isolation, loss and delay stay.
func (c *NetnsCluster) Partition(groups [][]int) error {
	return c.changeFaults("partition", func(f *faultState) error { return f.partition(groups) }, "groups", fmt.Sprint(groups))
}

// Block drops node from's packets to node to (TCP connections between them
// then fail both ways; datagrams only one way).
func (c *NetnsCluster) Block(from, to int) error {
	return c.changeFaults("block", func(f *faultState) error {
		if from < 0 || from >= f.n || to < 0 || to >= f.n || from == to {
			return fmt.Errorf("chaos: block %d -> %d: want two different nodes of 0..%d", from, to, f.n-1)
		}
		f.cut[from][to] = true
		return nil
	}, "from", c.NodeID(from), "to", c.NodeID(to))
}

// IsolateClient drops node i's traffic with the harness's address.
func (c *NetnsCluster) IsolateClient(i int) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	return c.changeFaults("isolate client", func(f *faultState) error { f.isolated[i] = true; return nil }, "node", c.NodeID(i))
}

// Loss drops a random fraction (rounded to a percent) of node i's packets
// to its peers; 0 removes it.
func (c *NetnsCluster) Loss(i int, fraction float64) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	p, err := lossPercent(fraction)
	if err != nil {
		return err
	}
	return c.changeFaults("loss", func(f *faultState) error { f.loss[i] = p; return nil }, "node", c.NodeID(i), "percent", p)
}

// Delay adds d to every Raft message node i sends to its peers (requests on
// its connections and answers on theirs), through a userspace proxy in the
// harness; gossip and HTTP are not delayed. 0 removes it. Connections open
// at the time are reset so that Raft reconnects through the proxy.
func (c *NetnsCluster) Delay(i int, d time.Duration) error {
	if _, err := c.node(i); err != nil {
		return err
	}
	if d < 0 || d > time.Minute {
		return fmt.Errorf("chaos: delay %v: want 0 to 1m", d)
	}
	return c.changeFaults("delay", func(f *faultState) error { f.delay[i] = d; return nil }, "node", c.NodeID(i), "delay", d)
}

// PartitionProtocols cuts the cluster into groups for the protocols p
// only (Raft, gossip and/or the HTTP API between servers; the harness's
// clients still reach every node): the other protocols go on across the
// groups, so a server may be dead to Raft and alive to gossip, or the
// reverse. It replaces any earlier protocol partition; Heal removes it.
func (c *NetnsCluster) PartitionProtocols(groups [][]int, p Protocols) error {
	return c.changeFaults("protocol partition", func(f *faultState) error { return f.protoPartition(groups, p) },
		"groups", fmt.Sprint(groups), "protocols", p.String())
}

// Heal removes every network fault (clock faults stay).
func (c *NetnsCluster) Heal() error {
	return c.changeFaults("heal", func(f *faultState) error { f.heal(); return nil })
}
