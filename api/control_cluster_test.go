package api

import (
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
)

// clusterMember is one node of a real three-node cluster on loopback, with
// the API in front of it.
type clusterMember struct {
	id   string
	n    *node.Node
	srv  *http.Server
	base string
	once sync.Once
}

func (m *clusterMember) stop() {
	m.once.Do(func() {
		m.srv.Close()
		m.n.Close()
	})
}

// freeAddr picks a loopback port free for both TCP and UDP (gossip uses
// both), below the kernel's ephemeral range so that no outgoing connection
// takes it before the node binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	for try := 0; try < 2000; try++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatal("no free loopback port for TCP and UDP")
	return ""
}

// startAPICluster forms a three-node cluster (bootstrap-expect 3) whose
// nodes serve the API on loopback.
func startAPICluster(t *testing.T) []*clusterMember {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	ids := []string{"c1", "c2", "c3"}
	gossip := make([]string, len(ids))
	for i := range ids {
		gossip[i] = freeAddr(t)
	}
	ms := make([]*clusterMember, len(ids))
	for i, id := range ids {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.NodeID, cfg.DataDir = id, t.TempDir()
		cfg.RaftAddr, cfg.GossipAddr, cfg.HTTPAddr = freeAddr(t), gossip[i], ln.Addr().String()
		cfg.BootstrapExpect, cfg.Join = 3, gossip
		cfg.TickPeriod = 50 * time.Millisecond
		// Raft's default 500 ms (a 250 ms leader lease) lets a saturated
		// machine depose leaders at random; the test crashes the leader
		// itself, and a second election costs only seconds of its 60.
		cfg.RaftTimeout = time.Second
		n, err := node.Open(cfg)
		if err != nil {
			ln.Close()
			t.Fatalf("open %s: %v", id, err)
		}
		m := &clusterMember{id: id, n: n, base: "http://" + ln.Addr().String(),
			srv: &http.Server{Handler: New(FromNode(n), Options{}), ReadHeaderTimeout: 10 * time.Second}}
		go m.srv.Serve(ln)
		ms[i] = m
		t.Cleanup(m.stop)
	}
	pollUntil(t, 60*time.Second, "a leader known to every node", func() bool {
		for _, m := range ms {
			if m.n.ReadyErr() != nil {
				return false
			}
			if _, ok := m.n.Leader(); !ok {
				return false
			}
		}
		return true
	})
	return ms
}

func leaderOf(ms []*clusterMember) *clusterMember {
	for _, m := range ms {
		if info, ok := m.n.Leader(); ok && info.Self {
			return m
		}
	}
	return nil
}

// TestControlClusterFollowerAndFailover: a client connected to a follower
// acquires the control lease (the follower sends it to the leader), every
// node's clients see the broadcasts, and the lease survives a leader crash
// while its owning connection stays up.
func TestControlClusterFollowerAndFailover(t *testing.T) {
	ms := startAPICluster(t)
	var l *clusterMember
	pollUntil(t, 30*time.Second, "a leader", func() bool { l = leaderOf(ms); return l != nil })
	var fs []*clusterMember
	for _, m := range ms {
		if m != l {
			fs = append(fs, m)
		}
	}
	owner := dialControl(t, fs[0].base, nil)   // on a follower
	onLeader := dialControl(t, l.base, nil)    // on the leader
	onOther := dialControl(t, fs[1].base, nil) // on the other follower

	got := acquire(t, owner, "K1 Composer", "ttlMs", 10000)
	checkToken(t, got.LeaseToken)
	for _, c := range []*wsClient{onLeader, onOther} {
		if ch := c.changed("acquired").state(t); ch.LeaseID != got.LeaseID || ch.OwnerClientName != "K1 Composer" {
			t.Fatalf("stateChanged on another node = %+v", ch)
		}
	}
	// Locked for a client of another node; status answers on a follower.
	wantWSError(t, onOther.reply(onOther.send(map[string]any{"type": "control.acquire"})), node.CodeControlLocked)
	if st := restStatus(t, fs[1].base); !st.Active || st.LeaseID != got.LeaseID {
		t.Fatalf("status on a follower = %+v", st)
	}
	hb := map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken}
	if m := owner.reply(owner.send(hb)); m.Type != "control.heartbeatAck" {
		t.Fatalf("heartbeat through a follower: %s", m.raw)
	}
	onOther.changed("heartbeat")
	// The follower's operations reached the leader over the Raft port: the
	// HTTP API of every node refuses the node-to-node route, even with the
	// forwarding header (issue 11), and the lease stays the owner's.
	for _, m := range ms {
		code, b := restDo(t, "POST", m.base+controlForwardPath, forgedForward, headerForwarded, "c9")
		if code != http.StatusNotFound {
			t.Fatalf("forged forward to %s: %d %s", m.id, code, b)
		}
	}
	if st := restStatus(t, fs[1].base); !st.Active || st.LeaseID != got.LeaseID || st.OwnerClientName != "K1 Composer" {
		t.Fatalf("status after forged forwards = %+v", st)
	}

	// The leader crashes; the owner's connection (on a follower) stays up.
	crash := time.Now()
	l.stop()
	var nl *clusterMember
	pollUntil(t, 60*time.Second, "a new leader", func() bool {
		nl = leaderOf(fs)
		return nl != nil && nl.n.ReadyErr() == nil
	})
	// Heartbeats go through again once the new leader is known; until then
	// they fail with NO_LEADER or INDETERMINATE, never with a lease error.
	var ack wsMsg
	pollUntil(t, 60*time.Second, "a heartbeat accepted by the new leader", func() bool {
		ack = owner.reply(owner.send(hb))
		if ack.Type == "error" {
			switch ack.Error.Code {
			case node.CodeNoLeader, node.CodeIndeterminate, node.CodeUnavailable:
				return false
			}
			t.Fatalf("heartbeat after failover: %s", ack.raw)
		}
		return true
	})
	if ack.Type != "control.heartbeatAck" {
		t.Fatalf("heartbeat after failover: %s", ack.raw)
	}
	var a struct {
		LeaseID string `json:"leaseId"`
	}
	json.Unmarshal(ack.Data, &a)
	if a.LeaseID != got.LeaseID {
		t.Fatalf("lease after failover %s, want %s", a.LeaseID, got.LeaseID)
	}
	t.Logf("heartbeats accepted again %v after the leader crashed", time.Since(crash).Round(time.Millisecond))
	var st node.ControlState
	pollUntil(t, 60*time.Second, "the status after the failover", func() bool {
		code, b := restDo(t, "GET", nl.base+"/v1/control/status", "")
		return code == 200 && json.Unmarshal(b, &st) == nil
	})
	if !st.Active || st.LeaseID != got.LeaseID || st.OwnerWSClientID != got.OwnerWSClientID {
		t.Fatalf("status after the failover = %+v", st)
	}
	// The gate on the new leader knows the token.
	// (503 and 504: leadership moving again on a loaded machine; retried.)
	settled := func(hdr ...string) (int, []byte) {
		var code int
		var b []byte
		pollUntil(t, 60*time.Second, "an answer from a leader", func() bool {
			code, b = restDo(t, "POST", nl.base+"/v1/leases/ls_0/revoke", "", hdr...)
			return code != 503 && code != 504
		})
		return code, b
	}
	if code, b := settled("X-Control-Lease", got.LeaseToken); code != 404 {
		t.Fatalf("gated route with the token after the failover: %d %s", code, b)
	}
	code, b := settled()
	restError(t, code, b, 428, node.CodeLeaseRequired)

	// The owner leaves: its follower releases the lease through the new
	// leader, and the other node's client sees it.
	owner.c.CloseNow()
	other := onOther
	if ch := other.changed("ownerDisconnected").state(t); ch.LeaseID != got.LeaseID || ch.Active {
		t.Fatalf("ownerDisconnected = %+v", ch)
	}
	// Whichever node leads by now (leadership may move again on a loaded
	// machine) answers the status.
	pollUntil(t, 60*time.Second, "an inactive status", func() bool {
		code, b := restDo(t, "GET", nl.base+"/v1/control/status", "")
		if code != 200 {
			return false
		}
		var st node.ControlState
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if st.Active {
			t.Fatalf("status after the owner left: %s", b)
		}
		return true
	})

	// A client of the remaining follower takes the lease and its socket
	// stays silent; an admin breaks it through that node (a follower unless
	// leadership moved: the break is forwarded like any admin write).
	var sf *clusterMember
	for _, m := range fs {
		if m != nl {
			sf = m
		}
	}
	stuck := dialControl(t, sf.base, nil)
	held := acquire(t, stuck, "stuck", "ttlMs", 60000)
	var brk []byte
	pollUntil(t, 60*time.Second, "the break answered by a leader", func() bool {
		var code int
		code, brk = restDo(t, "POST", sf.base+controlBreakPath, "")
		return code != 503 && code != 504
	})
	var broken node.ControlState
	if err := json.Unmarshal(brk, &broken); err != nil || broken.Active || broken.LeaseID != held.LeaseID {
		t.Fatalf("break through a follower: %s", brk)
	}
	stuck.changed("revoked")
}
