//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The real-process tier, tested from the outside: a three-node cluster of
// `leasehold server` processes in network namespaces, and for every fault
// proof that it does what it says (packets really stop, leadership really
// moves, data really survives), then that Close and Cleanup leave nothing.

func TestNetnsCluster(t *testing.T) {
	needNetnsHarness(t)
	bin := leaseholdBinary(t)
	// Kept (with the node logs) if the test fails.
	dir, err := os.MkdirTemp("", "leasehold-netns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("evidence kept in %s (logs/, data/)", dir)
			return
		}
		os.RemoveAll(dir)
	})
	runID := "t" + randomRunID()[:5]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := NewNetnsCluster(ctx, NetnsOptions{
		Nodes: 3, Binary: bin, Dir: dir, RunID: runID, Logger: testLogger(t),
		ExtraFlags: []string{"--tick-period", "50ms"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3-node netns cluster formed in %v", time.Since(start).Round(time.Millisecond))
	closed := false
	defer func() {
		if t.Failed() {
			for i := range c.Size() {
				b, _ := os.ReadFile(c.LogPath(i))
				if len(b) > 16<<10 {
					b = b[len(b)-16<<10:]
				}
				t.Logf("---- %s (%s) ----\n%s", c.NodeID(i), c.LogPath(i), b)
			}
		}
		if !closed {
			c.Close(context.Background(), false)
		}
	}()

	t.Run("Partition", func(t *testing.T) {
		l := leaderOf(t, c, []int{0, 1, 2})
		rest := without(3, l)
		if err := c.Partition([][]int{{l}, rest}); err != nil {
			t.Fatal(err)
		}
		for _, o := range rest {
			wantCut(t, c.Namespace(l), raftAddr(c, o))
			wantCut(t, c.Namespace(o), c.HTTPAddr(l))
		}
		wantReach(t, c.Namespace(rest[0]), raftAddr(c, rest[1]))
		for i := range 3 {
			wantReach(t, "", c.HTTPAddr(i))
		}
		nl := leaderOf(t, c, rest)
		eventually(t, "the isolated leader steps down", func() (bool, string) {
			v, err := c.status(context.Background(), l)
			if err != nil {
				return false, err.Error()
			}
			return v.State != "Leader", v.State
		})
		t.Logf("isolated leader %s stepped down; %s leads the majority", c.NodeID(l), c.NodeID(nl))
		heal(t, c)
		wantReach(t, c.Namespace(l), raftAddr(c, rest[0]))
	})

	t.Run("Block", func(t *testing.T) {
		if err := c.Block(0, 1); err != nil {
			t.Fatal(err)
		}
		if got := udpDelivered(t, c.Namespace(0), c.Namespace(1), c.nodeIP(0), c.nodeIP(1)+":7791", 20); got != 0 {
			t.Fatalf("blocked 0 -> 1: %d of 20 datagrams arrived", got)
		}
		if got := udpDelivered(t, c.Namespace(1), c.Namespace(0), c.nodeIP(1), c.nodeIP(0)+":7791", 20); got != 20 {
			t.Fatalf("open 1 -> 0: %d of 20 datagrams arrived", got)
		}
		wantCut(t, c.Namespace(0), raftAddr(c, 1))
		wantReach(t, c.Namespace(0), raftAddr(c, 2))
		wantReach(t, c.Namespace(2), raftAddr(c, 1))
		heal(t, c)
		if got := udpDelivered(t, c.Namespace(0), c.Namespace(1), c.nodeIP(0), c.nodeIP(1)+":7791", 20); got != 20 {
			t.Fatalf("healed 0 -> 1: %d of 20 datagrams arrived", got)
		}
	})

	t.Run("IsolateClient", func(t *testing.T) {
		l := leaderOf(t, c, []int{0, 1, 2})
		iso, other := (l+1)%3, (l+2)%3
		if err := c.IsolateClient(iso); err != nil {
			t.Fatal(err)
		}
		wantCut(t, "", c.HTTPAddr(iso))
		wantReach(t, "", c.HTTPAddr(l))
		wantReach(t, c.Namespace(other), c.HTTPAddr(iso))
		wantReach(t, c.Namespace(iso), raftAddr(c, l))
		eventually(t, "the isolated node stays a healthy voter", func() (bool, string) {
			v, err := c.status(context.Background(), l)
			if err != nil {
				return false, err.Error()
			}
			for _, m := range v.Members {
				if m.ID == c.NodeID(iso) {
					return m.Voter && m.Health == "healthy" && len(v.Members) == 3 && v.State == "Leader", fmt.Sprintf("%s %+v", v.State, v.Members)
				}
			}
			return false, fmt.Sprintf("%+v", v.Members)
		})
		heal(t, c)
	})

	t.Run("Loss", func(t *testing.T) {
		if err := c.Loss(1, 1); err != nil {
			t.Fatal(err)
		}
		if got := udpDelivered(t, c.Namespace(1), c.Namespace(0), c.nodeIP(1), c.nodeIP(0)+":7792", 20); got != 0 {
			t.Fatalf("loss 100%%: %d of 20 datagrams arrived", got)
		}
		if err := c.Loss(1, 0.5); err != nil {
			t.Fatal(err)
		}
		got := udpDelivered(t, c.Namespace(1), c.Namespace(0), c.nodeIP(1), c.nodeIP(0)+":7792", 400)
		if got < 120 || got > 280 {
			t.Fatalf("loss 50%%: %d of 400 datagrams arrived", got)
		}
		if back := udpDelivered(t, c.Namespace(0), c.Namespace(1), c.nodeIP(0), c.nodeIP(1)+":7792", 100); back != 100 {
			t.Fatalf("loss is node 1's outgoing only: %d of 100 arrived at it", back)
		}
		t.Logf("loss 50%%: %d of 400 datagrams arrived", got)
		if err := c.Loss(1, 1.5); err == nil {
			t.Fatal("loss 1.5 accepted")
		}
		heal(t, c)
	})

	t.Run("Delay", func(t *testing.T) {
		// Node 2's Raft port is taken over by an echo server while it is
		// down, so that the round trip through the proxy can be timed.
		if err := c.Kill(2); err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		if err := inNamespace(c.Namespace(2), func() (err error) {
			ln, err = net.Listen("tcp4", raftAddr(c, 2))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(conn, conn); conn.Close() }()
			}
		}()
		rtt := func() (time.Duration, error) {
			var d time.Duration
			err := inNamespace(c.Namespace(0), func() error {
				conn, err := net.DialTimeout("tcp4", raftAddr(c, 2), 3*time.Second)
				if err != nil {
					return err
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				start := time.Now()
				if _, err := conn.Write([]byte("ping")); err != nil {
					return err
				}
				buf := make([]byte, 4)
				if _, err := io.ReadFull(conn, buf); err != nil {
					return err
				}
				d = time.Since(start)
				return nil
			})
			return d, err
		}
		before, err := rtt()
		if err != nil {
			t.Fatal(err)
		}
		// A connection open before the delay is reset.
		var old net.Conn
		if err := inNamespace(c.Namespace(0), func() (err error) {
			old, err = net.DialTimeout("tcp4", raftAddr(c, 2), 3*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if err := c.Delay(0, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		delayed, err := rtt()
		if err != nil {
			t.Fatal(err)
		}
		old.SetDeadline(time.Now().Add(3 * time.Second))
		_, werr := old.Write([]byte("ping"))
		if werr == nil {
			_, werr = io.ReadFull(old, make([]byte, 4))
		}
		if err := c.Delay(2, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		both, err := rtt()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round trip 0 -> 2: %v direct, %v with 300ms on 0, %v with 200ms on 2 too", before, delayed, both)
		if delayed < 300*time.Millisecond || delayed > 2*time.Second {
			t.Fatalf("round trip with a 300ms delay: %v", delayed)
		}
		if both < 500*time.Millisecond || both > 3*time.Second {
			t.Fatalf("round trip with 300ms + 200ms delays: %v", both)
		}
		if werr == nil {
			t.Fatal("a connection opened before the delay still works unproxied")
		}
		if err := c.Heal(); err != nil {
			t.Fatal(err)
		}
		// The best of three: a delay still applied slows every one, a
		// loaded machine only some.
		after := time.Hour
		for range 3 {
			d, err := rtt()
			if err != nil {
				t.Fatal(err)
			}
			after = min(after, d)
		}
		if after >= 300*time.Millisecond {
			t.Fatalf("round trip after heal: %v", after)
		}
		ln.Close()
		if err := c.Restart(2); err != nil {
			t.Fatal(err)
		}
		waitFormed(t, c)
		// Raft itself through the proxies: the leader delayed, the cluster
		// keeps (or regains) one leader and all voters.
		l := leaderOf(t, c, []int{0, 1, 2})
		if err := c.Delay(l, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		waitFormed(t, c)
		if code, body, err := httpDo(c, l, "POST", "/v1/leases", map[string]any{"key": "delay", "holder": "t", "ttl_ms": 5000}); err != nil || code != 201 {
			t.Fatalf("acquire through a delayed leader: %d %s %v", code, body, err)
		}
		heal(t, c)
	})

	t.Run("PauseResume", func(t *testing.T) {
		l := leaderOf(t, c, []int{0, 1, 2})
		if err := c.Pause(l); err != nil {
			t.Fatal(err)
		}
		c.nodes[l].mu.Lock()
		pid := c.nodes[l].cmd.Process.Pid
		c.nodes[l].mu.Unlock()
		eventually(t, "process stopped", func() (bool, string) {
			st := procState(pid)
			return st == "T", st
		})
		if !c.Alive(l) {
			t.Fatal("a paused node is not alive")
		}
		if code, _, err := httpDo(c, l, "GET", "/healthz", nil); err == nil {
			t.Fatalf("paused node answered /healthz: %d", code)
		}
		nl := leaderOf(t, c, without(3, l))
		t.Logf("paused leader %s; %s took over", c.NodeID(l), c.NodeID(nl))
		if err := c.Resume(l); err != nil {
			t.Fatal(err)
		}
		if st := procState(pid); st == "T" {
			t.Fatalf("resumed process state %s", st)
		}
		waitFormed(t, c)
	})

	t.Run("ClockUnsupported", func(t *testing.T) {
		// A normal build has no chaos clock: its log shows the server
		// started without the chaos clock's warning.
		if err := c.ClockJump(1, 0); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("ClockJump on a normal build: %v, want ErrUnsupported", err)
		}
		if err := c.ClockRate(1, 1.5); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("ClockRate on a normal build: %v, want ErrUnsupported", err)
		}
		if _, err := os.Stat(c.ClockPath(1)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("clock file written for a normal build: %v", err)
		}
		c.nodes[1].mu.Lock()
		pid := c.nodes[1].cmd.Process.Pid
		c.nodes[1].mu.Unlock()
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(env, []byte("LEASEHOLD_CHAOS_CLOCK="+c.ClockPath(1)+"\x00")) {
			t.Fatalf("node 1's environment lacks LEASEHOLD_CHAOS_CLOCK=%s", c.ClockPath(1))
		}
	})

	var leaseID string
	var fence float64
	t.Run("KillRestartKeepsData", func(t *testing.T) {
		// The leader PauseResume resumed may still be stepping down: n0
		// answers 503 NO_LEADER (nothing applied) until the new term is
		// known; any other refusal fails.
		var body []byte
		eventually(t, "an acquire through n0", func() (bool, string) {
			var code int
			var err error
			code, body, err = httpDo(c, 0, "POST", "/v1/leases", map[string]any{"key": "kept", "holder": "t", "ttl_ms": 600000})
			if err == nil && code == 503 {
				return false, string(body)
			}
			if err != nil || code != 201 {
				t.Fatalf("acquire: %d %s %v", code, body, err)
			}
			return true, ""
		})
		var l map[string]any
		json.Unmarshal(body, &l)
		leaseID, _ = l["lease_id"].(string)
		fence, _ = l["fencing_token"].(float64)
		for i := range 3 {
			if err := c.Kill(i); err != nil {
				t.Fatal(err)
			}
			if c.Alive(i) {
				t.Fatalf("%s alive after Kill", c.NodeID(i))
			}
		}
		if err := dialFrom("", c.HTTPAddr(0), 500*time.Millisecond); err == nil {
			t.Fatal("a killed node accepts connections")
		}
		if err := c.Restart(0); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(0); err == nil {
			t.Fatal("Restart of a running node accepted")
		}
		for i := 1; i < 3; i++ {
			if err := c.Restart(i); err != nil {
				t.Fatal(err)
			}
		}
		waitFormed(t, c)
		for i := range 3 {
			code, body, err := httpDo(c, i, "GET", "/v1/leases/"+leaseID+"?stale=true", nil)
			if err != nil || code != 200 {
				t.Fatalf("%s after restart of all: %d %s %v", c.NodeID(i), code, body, err)
			}
			var got map[string]any
			json.Unmarshal(body, &got)
			if got["state"] != "active" || got["fencing_token"] != fence {
				t.Fatalf("%s after restart of all: %s", c.NodeID(i), body)
			}
		}
		b, _ := os.ReadFile(c.LogPath(0))
		if n := bytes.Count(b, []byte("==== chaos: starting n0")); n < 2 {
			t.Fatalf("log of n0 has %d starts, want it appended across restarts", n)
		}
	})

	t.Run("Wipe", func(t *testing.T) {
		l := leaderOf(t, c, []int{0, 1, 2})
		w := (l + 1) % 3
		if err := c.Wipe(w); err != nil {
			t.Fatal(err)
		}
		if c.Alive(w) {
			t.Fatal("wiped node alive")
		}
		if _, err := os.Stat(c.DataDir(w)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("data dir after wipe: %v", err)
		}
		if code, body, err := httpDo(c, l, "DELETE", "/v1/cluster/members/"+c.NodeID(w), nil); err != nil || code/100 != 2 {
			t.Fatalf("remove %s: %d %s %v", c.NodeID(w), code, body, err)
		}
		if err := c.Restart(w); err != nil {
			t.Fatal(err)
		}
		waitFormed(t, c)
		code, body, err := httpDo(c, w, "GET", "/v1/leases/"+leaseID+"?stale=true", nil)
		if err != nil || code != 200 {
			t.Fatalf("wiped node after rejoining: %d %s %v", code, body, err)
		}
	})

	t.Run("CleanupLeavesLiveRun", func(t *testing.T) {
		if err := Cleanup(context.Background(), testLogger(t)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := os.Stat("/run/netns/" + c.Namespace(i)); err != nil {
				t.Fatalf("Cleanup removed a live run's namespace: %v", err)
			}
		}
		waitFormed(t, c)
	})

	t.Run("Close", func(t *testing.T) {
		if err := c.Close(context.Background(), false); err != nil {
			t.Fatal(err)
		}
		closed = true
		assertRunGone(t, c.prefix)
		for i := range 3 {
			if c.Alive(i) {
				t.Fatalf("%s alive after Close", c.NodeID(i))
			}
			if _, err := os.Stat(c.LogPath(i)); err != nil {
				t.Fatalf("log gone after Close: %v", err)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("data kept after Close(keepData=false): %v", err)
		}
	})
}

// TestNetnsClock runs a one-node cluster of a binary built with the chaos
// tag and checks that the clock faults reach the server: a wall-clock jump
// shows in the display times it computes, a monotonic rate of 2 makes its
// ticks come twice as fast.
func TestNetnsClock(t *testing.T) {
	needNetnsHarness(t)
	bin := buildLeasehold(t, "chaos")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := NewNetnsCluster(ctx, NetnsOptions{
		Nodes: 1, Binary: bin, Dir: dir, RunID: "c" + randomRunID()[:5], Logger: testLogger(t),
		ExtraFlags: []string{"--tick-period", "100ms"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background(), false)
	if err := c.ClockJump(0, 0); err != nil {
		t.Fatalf("ClockJump on a chaos build: %v", err)
	}
	if err := c.ClockRate(0, 0); err == nil {
		t.Fatal("rate 0 accepted")
	}

	code, body, err := httpDo(c, 0, "POST", "/v1/leases", map[string]any{"key": "clock", "holder": "t", "ttl_ms": 60000})
	if err != nil || code != 201 {
		t.Fatalf("acquire: %d %s %v", code, body, err)
	}
	var l struct {
		LeaseID   string    `json:"lease_id"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatal(err)
	}
	if err := c.ClockJump(0, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.ClockJump(0, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(c.ClockPath(0))
	if err != nil {
		t.Fatal(err)
	}
	var f clockFault
	if err := json.Unmarshal(b, &f); err != nil || f.WallOffsetNS != int64(time.Hour) || f.MonoRate != 1 {
		t.Fatalf("clock file: %s %v", b, err)
	}
	eventually(t, "expires_at an hour ahead", func() (bool, string) {
		code, body, err := httpDo(c, 0, "GET", "/v1/leases/"+l.LeaseID+"?stale=true", nil)
		if err != nil || code != 200 {
			return false, fmt.Sprintf("%d %s %v", code, body, err)
		}
		var now struct {
			ExpiresAt time.Time `json:"expires_at"`
		}
		json.Unmarshal(body, &now)
		shift := now.ExpiresAt.Sub(l.ExpiresAt)
		return shift > 55*time.Minute && shift < 65*time.Minute, fmt.Sprintf("expires_at moved by %v", shift)
	})
	if err := c.ClockJump(0, -time.Hour); err != nil {
		t.Fatal(err)
	}

	// Real time for 15 ticks, at rate 1 and at rate 2.
	tick := func() uint64 {
		var st struct {
			Tick uint64 `json:"tick"`
		}
		code, body, err := httpDo(c, 0, "GET", "/v1/cluster?stale=true", nil)
		if err != nil || code != 200 || json.Unmarshal(body, &st) != nil {
			t.Fatalf("cluster status: %d %s %v", code, body, err)
		}
		return st.Tick
	}
	ticks15 := func() time.Duration {
		start, t0 := time.Now(), tick()
		eventually(t, "15 ticks", func() (bool, string) {
			n := tick()
			return n >= t0+15, fmt.Sprintf("tick %d from %d", n, t0)
		})
		return time.Since(start)
	}
	normal := ticks15()
	if err := c.ClockRate(0, 2); err != nil {
		t.Fatal(err)
	}
	ticks15() // the rate reaches the tick loop within a poll and a tick
	fast := ticks15()
	t.Logf("15 ticks of 100ms: %v at rate 1, %v at rate 2", normal, fast)
	if fast > normal*3/4 {
		t.Fatalf("rate 2 did not speed the ticks up: %v at rate 1, %v at rate 2", normal, fast)
	}
}
