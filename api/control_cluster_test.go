package api

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testcluster"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// clusterMember is one node of a real three-node cluster on loopback, with
// the API in front of it.
type clusterMember = testcluster.Member

// startAPICluster forms a three-node cluster (bootstrap-expect 3) whose
// nodes serve the API on loopback.
func startAPICluster(t *testing.T) []*clusterMember {
	return testcluster.Start(t, func(n *node.Node) http.Handler { return New(FromNode(n), Options{}) })
}

func leaderOf(ms []*clusterMember) *clusterMember { return testcluster.Leader(ms) }

// moving says whether a control reply is what a node answers while
// leadership moves (a loaded machine deposes leaders): NO_LEADER or
// UNAVAILABLE, which applied nothing, and, if indeterminate is set (the
// request is safe to repeat), INDETERMINATE.
func moving(m wsMsg, indeterminate bool) bool {
	if m.Type != "error" || m.Error == nil {
		return false
	}
	switch m.Error.Code {
	case wire.CodeNoLeader, wire.CodeUnavailable:
		return true
	case wire.CodeIndeterminate:
		return indeterminate
	}
	return false
}

// settledReply sends req on w until the answer is not one of leadership
// moving (moving), and returns it.
func settledReply(t *testing.T, w *wsClient, req map[string]any, indeterminate bool, what string) wsMsg {
	t.Helper()
	var m wsMsg
	pollUntil(t, 60*time.Second, what, func() bool {
		r := map[string]any{}
		for k, v := range req {
			if k != "requestId" {
				r[k] = v
			}
		}
		m = w.reply(w.send(r))
		return !moving(m, indeterminate)
	})
	return m
}

// settledStatus is restStatus through base, asked again while leadership
// moves (503, 504).
func settledStatus(t *testing.T, base string) node.ControlState {
	t.Helper()
	pollUntil(t, 60*time.Second, "a control status from "+base, func() bool {
		code, _ := restDo(t, "GET", base+"/v1/control/status", "")
		return code != http.StatusServiceUnavailable && code != http.StatusGatewayTimeout
	})
	return restStatus(t, base)
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
	owner := dialControl(t, fs[0].Addr, nil)                // on a follower
	onLeader := dialControl(t, l.Addr, nil).registered()    // on the leader
	onOther := dialControl(t, fs[1].Addr, nil).registered() // on the other follower

	// Before the crash, leadership may move too on a loaded machine: the
	// requests that get NO_LEADER (nothing applied) are sent again. The
	// lease's TTL outlasts any wait of the test between two heartbeats.
	acq := settledReply(t, owner, map[string]any{"type": "control.acquire", "clientName": "K1 Composer",
		"clientInstanceId": "6f0d84a3-8f49-4da8-8c70-0b8f6db5a870", "scope": "global", "ttlMs": 60000}, false, "the control lease")
	if acq.Type != "control.acquired" || !acq.Success {
		t.Fatalf("acquire: %s", acq.raw)
	}
	got := acq.state(t)
	checkToken(t, got.LeaseToken)
	for _, c := range []*wsClient{onLeader, onOther} {
		if ch := c.changed("acquired").state(t); ch.LeaseID != got.LeaseID || ch.OwnerClientName != "K1 Composer" {
			t.Fatalf("stateChanged on another node = %+v", ch)
		}
	}
	// Locked for a client of another node; status answers on a follower.
	wantWSError(t, settledReply(t, onOther, map[string]any{"type": "control.acquire"}, true, "a locked answer"), wire.CodeControlLocked)
	if st := settledStatus(t, fs[1].Addr); !st.Active || st.LeaseID != got.LeaseID {
		t.Fatalf("status on a follower = %+v", st)
	}
	hb := map[string]any{"type": "control.heartbeat", "leaseId": got.LeaseID, "leaseToken": got.LeaseToken}
	if m := settledReply(t, owner, hb, true, "a heartbeat through a follower"); m.Type != "control.heartbeatAck" {
		t.Fatalf("heartbeat through a follower: %s", m.raw)
	}
	onOther.changed("heartbeat")
	// The follower's operations reached the leader over the Raft port: the
	// HTTP API of every node refuses the node-to-node route, even with the
	// forwarding header (issue 11), and the lease stays the owner's.
	for _, m := range ms {
		code, b := restDo(t, "POST", m.Addr+controlForwardPath, forgedForward, headerForwarded, "c9")
		if code != http.StatusNotFound {
			t.Fatalf("forged forward to %s: %d %s", m.ID, code, b)
		}
	}
	if st := settledStatus(t, fs[1].Addr); !st.Active || st.LeaseID != got.LeaseID || st.OwnerClientName != "K1 Composer" {
		t.Fatalf("status after forged forwards = %+v", st)
	}

	// The leader crashes; the owner's connection (on a follower) stays up.
	crash := time.Now()
	l.Stop()
	var nl *clusterMember
	pollUntil(t, 60*time.Second, "a new leader", func() bool {
		nl = leaderOf(fs)
		return nl != nil && nl.Node.ReadyErr() == nil
	})
	// Heartbeats go through again once the new leader is known; until then
	// they fail with NO_LEADER or INDETERMINATE, never with a lease error.
	var ack wsMsg
	pollUntil(t, 60*time.Second, "a heartbeat accepted by the new leader", func() bool {
		ack = owner.reply(owner.send(hb))
		if ack.Type == "error" {
			switch ack.Error.Code {
			case wire.CodeNoLeader, wire.CodeIndeterminate, wire.CodeUnavailable:
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
		code, b := restDo(t, "GET", nl.Addr+"/v1/control/status", "")
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
			code, b = restDo(t, "POST", nl.Addr+"/v1/leases/ls_0/revoke", "", hdr...)
			return code != 503 && code != 504
		})
		return code, b
	}
	if code, b := settled("X-Control-Lease", got.LeaseToken); code != 404 {
		t.Fatalf("gated route with the token after the failover: %d %s", code, b)
	}
	code, b := settled()
	restError(t, code, b, 428, wire.CodeLeaseRequired)

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
		code, b := restDo(t, "GET", nl.Addr+"/v1/control/status", "")
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
	stuck := dialControl(t, sf.Addr, nil)
	hm := settledReply(t, stuck, map[string]any{"type": "control.acquire", "clientName": "stuck",
		"clientInstanceId": "6f0d84a3-8f49-4da8-8c70-0b8f6db5a870", "scope": "global", "ttlMs": 60000}, false, "the stuck client's lease")
	if hm.Type != "control.acquired" || !hm.Success {
		t.Fatalf("acquire: %s", hm.raw)
	}
	held := hm.state(t)
	var brk []byte
	pollUntil(t, 60*time.Second, "the break answered by a leader", func() bool {
		var code int
		code, brk = restDo(t, "POST", sf.Addr+controlBreakPath, "")
		return code != 503 && code != 504
	})
	var broken node.ControlState
	if err := json.Unmarshal(brk, &broken); err != nil || broken.Active || broken.LeaseID != held.LeaseID {
		t.Fatalf("break through a follower: %s", brk)
	}
	stuck.changed("revoked")
}
