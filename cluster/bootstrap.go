package cluster

import (
	"errors"
	"sort"

	"github.com/hashicorp/raft"
)

// Forming a cluster and keeping its servers in touch: bootstrap-expect,
// and the gossip refresh a server runs while one of its configuration is
// missing from gossip.

// bootstrapOutcome says what tryBootstrapExpect did.
type bootstrapOutcome int

const (
	// bootstrapWaiting: not enough new servers see each other yet.
	bootstrapWaiting bootstrapOutcome = iota
	// bootstrapExisting: a server with Raft state is alive, so a cluster
	// exists (its leader adds this server).
	bootstrapExisting
	// bootstrapMismatch: a new server expects another cluster size.
	bootstrapMismatch
	// bootstrapTooMany: more new servers than expected see each other.
	bootstrapTooMany
	// bootstrapFormed: this server bootstrapped the configuration (or
	// another did first: either way the cluster exists now).
	bootstrapFormed
)

// tryBootstrapExpect forms a new cluster when exactly expect new servers
// with the same setting see each other in g. Each of them computes the same
// configuration (every one of them, sorted by id) and bootstraps it. With
// bootstrapMismatch, peer names the server that disagrees.
func (c *Cluster) tryBootstrapExpect(g *Gossip, expect int) (out bootstrapOutcome, peer Peer, err error) {
	var servers []Server
	for _, p := range g.Peers() {
		if p.Status != "alive" {
			continue
		}
		if p.HasState {
			return bootstrapExisting, p, nil
		}
		if p.Expect != expect {
			return bootstrapMismatch, p, nil
		}
		if p.Raft == "" {
			return bootstrapWaiting, p, nil
		}
		servers = append(servers, Server{Voter: true, ID: p.ID, Address: p.Raft})
	}
	switch {
	case len(servers) > expect:
		return bootstrapTooMany, Peer{}, nil
	case len(servers) < expect:
		return bootstrapWaiting, Peer{}, nil
	}
	sort.Slice(servers, func(i, j int) bool { return servers[i].ID < servers[j].ID })
	if err := c.BootstrapWith(servers); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return bootstrapFormed, Peer{}, err
	}
	return bootstrapFormed, Peer{}, nil
}

// missingServer reports whether a server of the Raft configuration other
// than this one is not alive in g.
func (c *Cluster) missingServer(g *Gossip) bool {
	conf, err := c.Configuration()
	if err != nil {
		return false
	}
	alive := map[string]bool{}
	for _, p := range g.Peers() {
		if p.Status == "alive" {
			alive[p.ID] = true
		}
	}
	for _, s := range conf.Servers {
		if string(s.ID) != c.cfg.NodeID && !alive[string(s.ID)] {
			return true
		}
	}
	return false
}

// moved reports whether the latest Raft configuration lists this server at
// an address other than the one it advertises now: it restarted at another
// address, and the leader has not updated the member yet (Reconcile does
// once gossip carries the new address).
func (c *Cluster) moved() bool {
	conf, err := c.Configuration()
	if err != nil {
		return false
	}
	for _, s := range conf.Servers {
		if string(s.ID) == c.cfg.NodeID {
			return s.Address != c.Addr
		}
	}
	return false
}
