package chaos

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// faultState is every network fault in force, from which each node's
// nftables table is rendered. It is plain data so that the rendering is
// tested without root.
type faultState struct {
	n        int
	cut      [][]bool        // cut[a][b]: a's packets to b are dropped
	isolated []bool          // node's traffic with the harness is dropped
	loss     []int           // percent of node's packets to peers dropped
	delay    []time.Duration // added to node's Raft messages to peers
	// protoCut[a][b]: a's packets to b of these protocols are dropped
	// (a protocol partition: the other protocols go on).
	protoCut [][]Protocols
	// rate[a][b], if > 0, caps the bytes a sends b over Raft per second
	// (a throttled link, through the delay proxy).
	rate [][]int64
}

// Protocols is a set of the protocols servers speak to each other, for a
// partition of some of them only (Raft, gossip, or the HTTP API a
// follower forwards over).
type Protocols uint8

const (
	ProtoRaft Protocols = 1 << iota
	ProtoGossip
	ProtoHTTP
)

func (p Protocols) String() string {
	var names []string
	for _, x := range []struct {
		p    Protocols
		name string
	}{{ProtoRaft, "raft"}, {ProtoGossip, "gossip"}, {ProtoHTTP, "http"}} {
		if p&x.p != 0 {
			names = append(names, x.name)
		}
	}
	return strings.Join(names, "+")
}

func newFaultState(n int) faultState {
	f := faultState{n: n, isolated: make([]bool, n), loss: make([]int, n), delay: make([]time.Duration, n)}
	f.cut = make([][]bool, n)
	f.protoCut = make([][]Protocols, n)
	f.rate = make([][]int64, n)
	for i := range f.cut {
		f.cut[i] = make([]bool, n)
		f.protoCut[i] = make([]Protocols, n)
		f.rate[i] = make([]int64, n)
	}
	return f
}

// groupsOf returns each node's group (a node in no group is alone), or an
// error for a node named twice or out of range.
func (f *faultState) groupsOf(groups [][]int) ([]int, error) {
	group := make([]int, f.n)
	for i := range group {
		group[i] = -1 - i // alone unless named
	}
	for g, nodes := range groups {
		for _, i := range nodes {
			if i < 0 || i >= f.n {
				return nil, fmt.Errorf("chaos: partition: node %d: the cluster has nodes 0..%d", i, f.n-1)
			}
			if group[i] >= 0 {
				return nil, fmt.Errorf("chaos: partition: node %d is in two groups", i)
			}
			group[i] = g
		}
	}
	return group, nil
}

// protoPartition replaces every protocol cut with the groups' for the
// protocols p only (nodes in no group are alone); whole-node cuts stay.
func (f *faultState) protoPartition(groups [][]int, p Protocols) error {
	if p == 0 || p&^(ProtoRaft|ProtoGossip|ProtoHTTP) != 0 {
		return fmt.Errorf("chaos: protocol partition: protocols %#x: want raft, gossip and/or http", uint8(p))
	}
	group, err := f.groupsOf(groups)
	if err != nil {
		return err
	}
	for a := range f.n {
		for b := range f.n {
			f.protoCut[a][b] = 0
			if a != b && group[a] != group[b] {
				f.protoCut[a][b] = p
			}
		}
	}
	return nil
}

// partition replaces every cut with the groups' (nodes in no group are
// alone). It refuses a node named twice or out of range.
func (f *faultState) partition(groups [][]int) error {
	group, err := f.groupsOf(groups)
	if err != nil {
		return err
	}
	for a := range f.n {
		for b := range f.n {
			f.cut[a][b] = a != b && group[a] != group[b]
		}
	}
	return nil
}

func (f *faultState) heal() {
	*f = newFaultState(f.n)
}

// lossPercent turns a fraction into the percent the rules drop.
func lossPercent(fraction float64) (int, error) {
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return 0, fmt.Errorf("chaos: loss %v: want a fraction 0..1", fraction)
	}
	return int(math.Round(fraction * 100)), nil
}

// proxied reports whether node a's Raft connections to b go through the
// delay proxy (one of them is delayed, or their link is throttled).
func (f *faultState) proxied(a, b int) bool {
	return a != b && (f.delay[a] > 0 || f.delay[b] > 0 || f.rate[a][b] > 0 || f.rate[b][a] > 0)
}

// nftAddrs are the addresses the rules name.
type nftAddrs struct {
	nodes    []string // node i's address
	harness  string   // the harness's clients
	proxy    string   // the delay proxies (dial from and listen on)
	raftPort int
	// gossipPort and httpPort are the peers' other ports (protocol
	// partitions).
	gossipPort, httpPort int
	proxyFor             func(a, b int) int // proxy port for a's Raft connections to b
}

// render is the nftables script that replaces node i's table atomically.
//
// Chains and why their priorities:
//   - out (filter, output, -300): before the output NAT (-100), so peers are
//     matched by their real address even when a connection is redirected
//     to a delay proxy. Drops cut peers, the harness when isolated, and a
//     random share of the packets to peers under loss.
//   - in (filter, input, 200): after the input NAT (100), so replies
//     through a delay proxy carry the peer's real address again. Drops cut
//     peers and the harness when isolated. Packets from the proxy address
//     itself are the proxy's connections to this node's Raft port: the
//     sender's own output chain has already applied cuts and loss.
//   - nat_out (nat, output, -100): redirects Raft connections to peers that
//     are proxied to the proxy for that ordered pair.
//   - nat_in (nat, input, 100): empty; makes the reverse translation of
//     redirected connections explicit.
//   - unproxied (filter, output, 0): after the NAT, a packet still bound to
//     a proxied peer's Raft port belongs to a connection opened before the
//     delay: reset it so that Raft reconnects through the proxy.
func (f *faultState) render(table string, i int, a nftAddrs) string {
	var b strings.Builder
	// Declaring the table first makes the delete valid when it does not
	// exist yet; the three lines are one transaction.
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", table, table, table)

	var cutTo, cutFrom, peers []string
	for j := range f.n {
		if j == i {
			continue
		}
		peers = append(peers, a.nodes[j])
		if f.cut[i][j] {
			cutTo = append(cutTo, a.nodes[j])
		}
		if f.cut[j][i] {
			cutFrom = append(cutFrom, a.nodes[j])
		}
	}
	b.WriteString("\tchain out {\n\t\ttype filter hook output priority -300; policy accept;\n")
	if len(cutTo) > 0 {
		fmt.Fprintf(&b, "\t\tip daddr { %s } drop\n", strings.Join(cutTo, ", "))
	}
	for j := range f.n {
		b.WriteString(protoRules("daddr", a.nodes[j], f.protoCut[i][j], a))
	}
	if f.isolated[i] {
		fmt.Fprintf(&b, "\t\tip daddr %s drop\n", a.harness)
	}
	switch {
	case len(peers) == 0 || f.loss[i] == 0:
	case f.loss[i] >= 100:
		fmt.Fprintf(&b, "\t\tip daddr { %s } drop\n", strings.Join(peers, ", "))
	default:
		fmt.Fprintf(&b, "\t\tip daddr { %s } numgen random mod 100 < %d counter drop comment \"loss\"\n", strings.Join(peers, ", "), f.loss[i])
	}
	b.WriteString("\t}\n")

	b.WriteString("\tchain in {\n\t\ttype filter hook input priority 200; policy accept;\n")
	if len(cutFrom) > 0 {
		fmt.Fprintf(&b, "\t\tip saddr { %s } drop\n", strings.Join(cutFrom, ", "))
	}
	for j := range f.n {
		b.WriteString(protoRules("saddr", a.nodes[j], f.protoCut[j][i], a))
	}
	if f.isolated[i] {
		fmt.Fprintf(&b, "\t\tip saddr %s drop\n", a.harness)
	}
	b.WriteString("\t}\n")

	var redirect, reset []string
	for j := range f.n {
		if !f.proxied(i, j) {
			continue
		}
		redirect = append(redirect, fmt.Sprintf("\t\tip daddr %s tcp dport %d dnat ip to %s:%d\n", a.nodes[j], a.raftPort, a.proxy, a.proxyFor(i, j)))
		reset = append(reset, fmt.Sprintf("\t\tip daddr %s tcp dport %d reject with tcp reset\n", a.nodes[j], a.raftPort))
	}
	if len(redirect) > 0 {
		b.WriteString("\tchain nat_out {\n\t\ttype nat hook output priority -100; policy accept;\n")
		b.WriteString(strings.Join(redirect, ""))
		b.WriteString("\t}\n")
		b.WriteString("\tchain nat_in {\n\t\ttype nat hook input priority 100; policy accept;\n\t}\n")
		b.WriteString("\tchain unproxied {\n\t\ttype filter hook output priority 0; policy accept;\n")
		b.WriteString(strings.Join(reset, ""))
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// protoRules drops the packets to (dir "daddr") or from ("saddr") peer of
// the protocols p: both ends of a connection, the peer's port and this
// node's own (an answer on this node's listener), TCP for all three and UDP
// for gossip as well.
func protoRules(dir, peer string, p Protocols, a nftAddrs) string {
	var b strings.Builder
	for _, x := range []struct {
		p    Protocols
		port int
		udp  bool
	}{{ProtoRaft, a.raftPort, false}, {ProtoGossip, a.gossipPort, true}, {ProtoHTTP, a.httpPort, false}} {
		if p&x.p == 0 {
			continue
		}
		l4 := []string{"tcp"}
		if x.udp {
			l4 = append(l4, "udp")
		}
		for _, l := range l4 {
			fmt.Fprintf(&b, "\t\tip %s %s %s dport %d drop\n", dir, peer, l, x.port)
			fmt.Fprintf(&b, "\t\tip %s %s %s sport %d drop\n", dir, peer, l, x.port)
		}
	}
	return b.String()
}
