package chaos

import (
	"strings"
	"testing"
	"time"
)

// The nftables scripts the netns tier applies, checked as text (no root
// needed); netns_test.go checks on real namespaces that they do what they
// say.

func testAddrs() nftAddrs {
	return nftAddrs{
		nodes:    []string{"10.77.9.1", "10.77.9.2", "10.77.9.3"},
		harness:  "10.77.9.254",
		proxy:    "10.77.9.253",
		raftPort: 7701, gossipPort: 7702, httpPort: 7700,
		proxyFor: func(a, b int) int { return 17800 + a*9 + b },
	}
}

func TestRenderHealed(t *testing.T) {
	f := newFaultState(3)
	got := f.render("lhcx", 0, testAddrs())
	want := "table inet lhcx\ndelete table inet lhcx\ntable inet lhcx {\n" +
		"\tchain out {\n\t\ttype filter hook output priority -300; policy accept;\n\t}\n" +
		"\tchain in {\n\t\ttype filter hook input priority 200; policy accept;\n\t}\n}\n"
	if got != want {
		t.Fatalf("healed ruleset:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderPartitionAndBlock(t *testing.T) {
	f := newFaultState(3)
	if err := f.partition([][]int{{0}, {1, 2}}); err != nil {
		t.Fatal(err)
	}
	r0 := f.render("lhcx", 0, testAddrs())
	for _, want := range []string{
		"ip daddr { 10.77.9.2, 10.77.9.3 } drop",
		"ip saddr { 10.77.9.2, 10.77.9.3 } drop",
	} {
		if !strings.Contains(r0, want) {
			t.Fatalf("node 0 cut from 1 and 2: no %q in\n%s", want, r0)
		}
	}
	r1 := f.render("lhcx", 1, testAddrs())
	if !strings.Contains(r1, "ip daddr { 10.77.9.1 } drop") || !strings.Contains(r1, "ip saddr { 10.77.9.1 } drop") ||
		strings.Contains(r1, "10.77.9.3") || strings.Contains(r1, "10.77.9.254") {
		t.Fatalf("node 1 with 2, cut from 0:\n%s", r1)
	}
	// A node in no group is alone.
	if err := f.partition([][]int{{0, 1}}); err != nil {
		t.Fatal(err)
	}
	if !f.cut[2][0] || !f.cut[0][2] || f.cut[0][1] {
		t.Fatalf("node 2 named nowhere: cut %v", f.cut)
	}
	// A partition replaces earlier cuts; a block is one way.
	if err := f.partition(nil); err != nil {
		t.Fatal(err)
	}
	if !f.cut[0][1] {
		t.Fatal("no groups: every node alone")
	}
	f.heal()
	f.cut[0][1] = true
	r0, r1 = f.render("lhcx", 0, testAddrs()), f.render("lhcx", 1, testAddrs())
	if !strings.Contains(r0, "ip daddr { 10.77.9.2 } drop") || strings.Contains(r0, "saddr") {
		t.Fatalf("block 0 -> 1 at 0:\n%s", r0)
	}
	if !strings.Contains(r1, "ip saddr { 10.77.9.1 } drop") || strings.Contains(r1, "daddr") {
		t.Fatalf("block 0 -> 1 at 1:\n%s", r1)
	}
	for _, bad := range [][][]int{{{0}, {0, 1}}, {{3}}, {{-1}}} {
		g := newFaultState(3)
		if err := g.partition(bad); err == nil {
			t.Fatalf("partition %v accepted", bad)
		}
	}
}

func TestRenderIsolateLossDelay(t *testing.T) {
	f := newFaultState(3)
	f.isolated[1] = true
	r := f.render("lhcx", 1, testAddrs())
	if !strings.Contains(r, "ip daddr 10.77.9.254 drop") || !strings.Contains(r, "ip saddr 10.77.9.254 drop") {
		t.Fatalf("isolated:\n%s", r)
	}
	if strings.Contains(f.render("lhcx", 0, testAddrs()), "254") {
		t.Fatal("isolation of node 1 shows in node 0's rules")
	}

	f.heal()
	for _, tc := range []struct {
		frac float64
		want string
	}{
		{0.25, "ip daddr { 10.77.9.2, 10.77.9.3 } numgen random mod 100 < 25 counter drop comment \"loss\""},
		{1, "ip daddr { 10.77.9.2, 10.77.9.3 } drop"},
	} {
		p, err := lossPercent(tc.frac)
		if err != nil {
			t.Fatal(err)
		}
		f.loss[0] = p
		if r := f.render("lhcx", 0, testAddrs()); !strings.Contains(r, tc.want) {
			t.Fatalf("loss %v: no %q in\n%s", tc.frac, tc.want, r)
		}
	}
	for _, bad := range []float64{-0.1, 1.01} {
		if _, err := lossPercent(bad); err == nil {
			t.Fatalf("loss %v accepted", bad)
		}
	}

	f.heal()
	f.delay[2] = 100 * time.Millisecond
	r0 := f.render("lhcx", 0, testAddrs())
	// Node 0's connections to the delayed node 2 go through pair (0, 2);
	// those to node 1 stay direct.
	for _, want := range []string{
		"ip daddr 10.77.9.3 tcp dport 7701 dnat ip to 10.77.9.253:17802",
		"ip daddr 10.77.9.3 tcp dport 7701 reject with tcp reset",
		"type nat hook output priority -100",
		"type nat hook input priority 100",
	} {
		if !strings.Contains(r0, want) {
			t.Fatalf("delay on 2, node 0: no %q in\n%s", want, r0)
		}
	}
	if strings.Contains(r0, "10.77.9.2 tcp") {
		t.Fatalf("delay on 2 redirects 0 -> 1:\n%s", r0)
	}
	r2 := f.render("lhcx", 2, testAddrs())
	for _, want := range []string{"dnat ip to 10.77.9.253:17818", "dnat ip to 10.77.9.253:17819"} {
		if !strings.Contains(r2, want) {
			t.Fatalf("delay on 2, node 2: no %q in\n%s", want, r2)
		}
	}
	if f.render("lhcx", 1, testAddrs()) == r0 || !f.proxied(1, 2) || f.proxied(0, 1) {
		t.Fatal("proxied pairs")
	}
}

func TestRenderProtocolPartition(t *testing.T) {
	f := newFaultState(3)
	if err := f.protoPartition([][]int{{0}, {1, 2}}, ProtoRaft); err != nil {
		t.Fatal(err)
	}
	r0 := f.render("lhcx", 0, testAddrs())
	for _, want := range []string{
		"ip daddr 10.77.9.2 tcp dport 7701 drop",
		"ip daddr 10.77.9.3 tcp sport 7701 drop",
		"ip saddr 10.77.9.2 tcp dport 7701 drop",
		"ip saddr 10.77.9.3 tcp sport 7701 drop",
	} {
		if !strings.Contains(r0, want) {
			t.Fatalf("node 0 cut from 1 and 2 on Raft: no %q in\n%s", want, r0)
		}
	}
	if strings.Contains(r0, "7702") || strings.Contains(r0, "7700") || strings.Contains(r0, "ip daddr {") {
		t.Fatalf("a Raft partition touches other protocols or whole nodes:\n%s", r0)
	}
	r1 := f.render("lhcx", 1, testAddrs())
	if !strings.Contains(r1, "ip daddr 10.77.9.1 tcp dport 7701 drop") || strings.Contains(r1, "10.77.9.3") {
		t.Fatalf("node 1 with 2, cut from 0 on Raft:\n%s", r1)
	}
	// Gossip is TCP and UDP; HTTP is TCP; a new protocol partition
	// replaces the last.
	if err := f.protoPartition([][]int{{0, 1}, {2}}, ProtoGossip|ProtoHTTP); err != nil {
		t.Fatal(err)
	}
	r2 := f.render("lhcx", 2, testAddrs())
	for _, want := range []string{
		"ip daddr 10.77.9.1 udp dport 7702 drop", "ip daddr 10.77.9.1 tcp sport 7702 drop",
		"ip saddr 10.77.9.2 udp sport 7702 drop", "ip daddr 10.77.9.2 tcp dport 7700 drop",
	} {
		if !strings.Contains(r2, want) {
			t.Fatalf("node 2 cut from 0 and 1 on gossip and HTTP: no %q in\n%s", want, r2)
		}
	}
	if strings.Contains(r2, "7701") || strings.Contains(f.render("lhcx", 0, testAddrs()), "10.77.9.2 tcp dport 7702") {
		t.Fatalf("the Raft partition was not replaced, or 0 and 1 are cut:\n%s", r2)
	}
	f.heal()
	if strings.Contains(f.render("lhcx", 2, testAddrs()), "drop") {
		t.Fatal("heal left a protocol cut")
	}
	for _, p := range []Protocols{0, 8} {
		if err := f.protoPartition([][]int{{0}}, p); err == nil {
			t.Fatalf("protocols %v accepted", p)
		}
	}
}
