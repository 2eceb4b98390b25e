package main

// Process-level tests: they build the leasehold binary, run real servers on
// loopback, and talk to them over HTTP through the Go client.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// goBuild is `go build args...` (run in this directory unless the caller
// sets Dir) the way the Makefile's build target builds: CGO_ENABLED=0,
// -trimpath. Every binary the tests build (this package's, the previous
// release's, make test-python's) is built so: on a fresh machine the tree
// is compiled once for all of them (about 80 s of CPU), not once per
// flavour (plain, -trimpath, CGO_ENABLED=0), while the race-built tests
// of every package run beside.
func goBuild(args ...string) *exec.Cmd {
	cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// buildBinary builds the leasehold binary once per test process.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process-level test skipped in -short mode")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "leasehold-e2e-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "leasehold")
		out, err := goBuild("-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// freePort picks a loopback port free for both TCP and UDP (gossip uses
// both), below the kernel's ephemeral range (32768 and up on Linux) so that
// no outgoing connection takes it between the pick and the server's bind,
// and never the same one twice in this test process.
func freePort(t *testing.T) string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for try := 0; try < 2000; try++ {
		p := 20000 + rand.IntN(12000)
		if portsUsed[p] {
			continue
		}
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
		portsUsed[p] = true
		return addr
	}
	t.Fatal("no free loopback port for TCP and UDP")
	return ""
}

// server is one running `leasehold server` process.
type server struct {
	t          *testing.T
	bin        string
	nodeID     string
	tickPeriod string
	dataDir    string
	http       string
	raft       string
	gossip     string
	logPath    string
	extra      []string
	env        []string // added to the test's environment
	cmd        *exec.Cmd
	exited     chan struct{}
}

func newServer(t *testing.T, extra ...string) *server {
	dir := t.TempDir()
	return &server{t: t, bin: buildBinary(t), nodeID: "e2e", tickPeriod: "20ms", dataDir: filepath.Join(dir, "data"),
		http: freePort(t), raft: freePort(t), gossip: freePort(t),
		logPath: filepath.Join(dir, "server.log"), extra: extra}
}

// start launches the server and waits until it is ready.
func (s *server) start() {
	s.t.Helper()
	s.launch()
	s.waitReady()
}

// launch starts the process (with the same data directory and addresses
// every time) without waiting for it to be ready.
func (s *server) launch() {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	args := append([]string{"server", "--node-id", s.nodeID, "--data-dir", s.dataDir,
		"--http-addr", s.http, "--raft-addr", s.raft, "--gossip-addr", s.gossip,
		"--tick-period", s.tickPeriod, "--log-level", "debug"}, s.extra...)
	s.cmd = exec.Command(s.bin, args...)
	if len(s.env) > 0 {
		s.cmd.Env = append(os.Environ(), s.env...)
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	cmd := s.cmd
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	s.t.Cleanup(s.kill)
}

func (s *server) waitReady() {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + s.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-s.exited:
			s.t.Fatalf("server exited before ready; log:\n%s", s.log())
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.t.Fatalf("server not ready within 20s; log:\n%s", s.log())
}

// kill sends SIGKILL: no shutdown code runs.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
	}
}

func (s *server) stop() error {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return nil
	case <-time.After(15 * time.Second):
		s.kill()
		return errors.New("server did not stop within 15s of SIGTERM")
	}
}

func (s *server) log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func (s *server) client(t *testing.T) *client.Client {
	c, err := client.New([]string{s.http}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		<-time.After(10 * time.Millisecond)
	}
}

func TestProcessLeaseLifecycle(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx := context.Background()

	// Exclusivity and a semaphore under concurrent acquires.
	var mu sync.Mutex
	wins := map[string]int{}
	var wg sync.WaitGroup
	for i := range 30 {
		for _, key := range []string{"excl", "sem"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				limit := uint32(1)
				if key == "sem" {
					limit = 4
				}
				_, err := c.Acquire(ctx, wire.AcquireRequest{Key: key, Holder: fmt.Sprint("w", i), TTLMS: 10000, Limit: limit})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					wins[key]++
				} else if client.ErrorCode(err) != wire.CodeLeaseHeld {
					t.Errorf("acquire %s: %v", key, err)
				}
			}()
		}
	}
	wg.Wait()
	if wins["excl"] != 1 || wins["sem"] != 4 {
		t.Fatalf("grants %v, want excl=1 sem=4", wins)
	}

	// Token checks and renewals.
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "renew-me", Holder: "a", TTLMS: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, l.LeaseID, "not-the-token", 0); client.StatusCode(err) != 403 || client.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("renew with a wrong token: %v", err)
	}
	r, err := c.Renew(ctx, l.LeaseID, l.Token, 3000)
	if err != nil || r.RenewalCount != 1 || r.TTLMS != 3000 {
		t.Fatalf("renew: %v %+v", err, r)
	}
	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, l.LeaseID, l.Token, 0); client.ErrorCode(err) != wire.CodeLeaseReleased {
		t.Fatalf("renew after release: %v", err)
	}

	// Idempotent acquire: concurrent identical requests give one lease.
	req := wire.AcquireRequest{Key: "svc/a", Holder: "gw", TTLMS: 5000, IdempotencyKey: "start-svc-a"}
	ids := make(chan string, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := c.Acquire(ctx, req)
			if err != nil {
				t.Errorf("idempotent acquire: %v", err)
				return
			}
			ids <- got.LeaseID + "/" + got.Token
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Fatalf("idempotent acquires gave %d distinct leases/tokens: %v", len(seen), seen)
	}
	req.TTLMS = 9000
	if _, err := c.Acquire(ctx, req); client.ErrorCode(err) != wire.CodeIdempotencyConflict {
		t.Fatalf("conflicting idempotent acquire: %v", err)
	}
}

func TestProcessExpiryOnEventStream(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	expired := make(chan wire.Event, 1)
	acquiredTick := make(chan uint64, 1)
	go c.Watch(ctx, client.WatchOptions{Key: "ttl", FromStart: true}, func(e wire.Event) error {
		if e.Type == "acquired" {
			select {
			case acquiredTick <- e.Tick:
			default: // a replay after a reconnection
			}
		}
		if e.Type == "expired" {
			expired <- e
			return io.EOF
		}
		return nil
	})
	ttl := time.Second // the server's smallest TTL
	sent := time.Now()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "ttl", Holder: "a", TTLMS: ttl.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-expired:
		took := time.Since(sent)
		if e.Lease == nil || e.Lease.LeaseID != l.LeaseID {
			t.Fatalf("expired event for %+v", e.Lease)
		}
		if took < ttl {
			t.Fatalf("expired %v after the acquire was sent, before its TTL %v", took, ttl)
		}
		// Two ticks of grace, counted in the server's ticks (20 ms): how
		// late those come in real time depends on the machine, so the
		// real-time bound is only a generous one.
		var at uint64
		select {
		case at = <-acquiredTick:
		default:
			t.Fatal("no acquired event before the expired one")
		}
		if ticks, limit := e.Tick-at, uint64(ttl/(20*time.Millisecond))+2; ticks > limit {
			t.Fatalf("expired %d ticks after the grant, later than %d", ticks, limit)
		}
		if took > ttl+10*time.Second {
			t.Fatalf("expired %v after send, too late for TTL %v", took, ttl)
		}
	case <-ctx.Done():
		t.Fatal("no expired event")
	}
}

func TestProcessWaitAndLockDelay(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx := context.Background()
	first, err := c.Acquire(ctx, wire.AcquireRequest{Key: "fifo", Holder: "a", TTLMS: 10000})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *wire.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "fifo", Holder: "b", TTLMS: 10000, WaitMS: 5000})
		if err != nil {
			t.Errorf("waiting acquire: %v", err)
		}
		got <- l
	}()
	// The waiter is queued once a plain acquire is told waiters are ahead.
	eventually(t, 5*time.Second, func() bool {
		_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "fifo", Holder: "probe", TTLMS: 1000})
		return client.ErrorCode(err) == wire.CodeLeaseHeld && strings.Contains(err.Error(), "queued")
	})
	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: first.LeaseID, Token: first.Token}); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil || l.Holder != "b" || l.FencingToken <= first.FencingToken {
		t.Fatalf("waiter got %+v", l)
	}

	// The lock-delay outlasts the gap between the revoke and the next
	// acquire on a loaded machine; it is counted from before the revoke
	// was sent (it starts when the revoke applies, later).
	const lockDelay = 2 * time.Second
	ld, err := c.Acquire(ctx, wire.AcquireRequest{Key: "delay", Holder: "a", TTLMS: 10000, LockDelayMS: lockDelay.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Revoke(ctx, ld.LeaseID, "test"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, wire.AcquireRequest{Key: "delay", Holder: "b", TTLMS: 1000})
	if client.ErrorCode(err) != wire.CodeLockDelay || client.StatusCode(err) != 409 {
		t.Fatalf("acquire in lock-delay: %v", err)
	}
	eventually(t, 15*time.Second, func() bool {
		_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "delay", Holder: "b", TTLMS: 1000})
		return err == nil
	})
	if since := time.Since(start); since < lockDelay {
		t.Fatalf("lock-delay of %v ended %v after the revoke was sent", lockDelay, since)
	}
}

// TestProcessKill9LosesNoAcknowledgedWrite kills the server with SIGKILL
// while writes are in flight and checks every acknowledged write after a
// restart.
func TestProcessKill9LosesNoAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx := context.Background()

	type acked struct {
		lease    *wire.Lease
		released bool
	}
	var mu sync.Mutex
	var log []*acked
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l, err := c.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("k/%d/%d", w, i), Holder: "w", TTLMS: 600000})
				if err != nil {
					return
				}
				a := &acked{lease: l}
				mu.Lock()
				log = append(log, a)
				mu.Unlock()
				if i%2 == 0 {
					if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
						return
					}
					mu.Lock()
					a.released = true
					mu.Unlock()
				}
			}
		}()
	}
	// Let some writes through, then kill -9 mid-flight.
	eventually(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(log) >= 200
	})
	s.kill()
	close(stop)
	wg.Wait()
	if len(log) < 50 {
		t.Fatalf("only %d acquires acknowledged before the kill", len(log))
	}
	s.start()
	for _, a := range log {
		got, err := c.Get(ctx, a.lease.LeaseID)
		if err != nil {
			t.Fatalf("acknowledged lease %s lost: %v", a.lease.LeaseID, err)
		}
		if got.FencingToken != a.lease.FencingToken || got.Key != a.lease.Key {
			t.Fatalf("lease %s changed: %+v vs %+v", a.lease.LeaseID, got, a.lease)
		}
		if a.released && got.State != "released" {
			t.Fatalf("acknowledged release of %s lost: state %s", a.lease.LeaseID, got.State)
		}
		if !a.released && got.State != "active" && got.State != "released" {
			t.Fatalf("lease %s in state %s", a.lease.LeaseID, got.State)
		}
	}
	// Fencing tokens keep rising after the restart.
	var maxFence uint64
	for _, a := range log {
		maxFence = max(maxFence, a.lease.FencingToken)
	}
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "after-restart", Holder: "w", TTLMS: 1000})
	if err != nil || l.FencingToken <= maxFence {
		t.Fatalf("fence after restart %v (max before %d): %v", l, maxFence, err)
	}
}

// TestProcessSecretsNeverLeak checks that no lease or session token shows up
// in the server's logs, the event stream, status, metrics or the data dir.
func TestProcessSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx := context.Background()
	var secrets []string
	var events bytes.Buffer
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		resp, err := http.Get("http://" + s.http + "/v1/events?after_index=0")
		if err != nil {
			return
		}
		defer resp.Body.Close()
		go func() { <-wctx.Done(); resp.Body.Close() }()
		io.Copy(&events, bufio.NewReader(resp.Body))
	}()
	sess, err := c.CreateSession(ctx, wire.SessionRequest{Holder: "runner", TTLMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	secrets = append(secrets, sess.Token)
	for i := range 20 {
		req := wire.AcquireRequest{Key: fmt.Sprint("cam/", i), Holder: "runner", TTLMS: 5000, IdempotencyKey: fmt.Sprint("idem-", i)}
		if i%2 == 1 {
			req = wire.AcquireRequest{Key: fmt.Sprint("cam/", i), SessionID: sess.SessionID, SessionToken: sess.Token}
		}
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, l.Token)
		if i%2 == 0 {
			if _, err := c.Renew(ctx, l.LeaseID, l.Token, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.SessionHeartbeat(ctx, sess.SessionID, sess.Token); err != nil {
		t.Fatal(err)
	}
	// Force a snapshot to disk by restarting gracefully (logs stay on disk too).
	var views []string
	for _, p := range []string{"/v1/cluster", "/metrics", "/v1/leases?limit=1000", "/v1/sessions", "/readyz"} {
		resp, err := http.Get("http://" + s.http + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		views = append(views, string(b))
	}
	wcancel()
	<-watchDone
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	var disk []string
	filepath.Walk(s.dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(p)
			disk = append(disk, string(b))
		}
		return nil
	})
	if len(disk) == 0 {
		t.Fatal("nothing in the data directory")
	}
	if !strings.Contains(events.String(), "acquired") {
		t.Fatalf("event stream captured nothing: %q", events.String())
	}
	for _, sec := range secrets {
		if len(sec) < 22 {
			t.Fatalf("token %q shorter than 16 bytes of base64url", sec)
		}
		for name, hay := range map[string]string{"log": s.log(), "events": events.String(),
			"views": strings.Join(views, "\n"), "data dir": strings.Join(disk, "\n")} {
			if strings.Contains(hay, sec) {
				t.Fatalf("secret token found in %s", name)
			}
		}
	}
}

// TestProcessHoldStopsChildWhenServerDies runs `hold` against a real server,
// SIGKILLs the server, and checks that hold stopped its command before the
// lease could have expired: before the last successful renewal (as the
// server recorded it, which is after it was sent) plus the TTL.
func TestProcessHoldStopsChildWhenServerDies(t *testing.T) {
	t.Parallel() // its own server and child process; mostly waiting on the TTL
	s := newServer(t)
	s.start()
	c := s.client(t)
	ctx := context.Background()
	command := helperCommand(t, "block")
	// A margin of 800 ms (TTL/10) between stopping the command and the
	// lease's earliest expiry: room for a loaded machine.
	const ttl = 8 * time.Second
	var out, errb bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- holdRun(ctx, c, holdOptions{key: "hold-key", holder: "h", ttl: ttl, command: command,
			stdout: &out, stderr: &errb}, make(chan os.Signal))
	}()
	eventually(t, 10*time.Second, func() bool {
		l, err := c.List(ctx, wire.ListRequest{Key: "hold-key", State: "active"})
		return err == nil && len(l.Leases) == 1 && l.Leases[0].RenewalCount >= 1
	})
	s.kill()
	var stopped time.Time
	select {
	case err := <-done:
		stopped = time.Now()
		if err == nil {
			t.Fatal("hold reported success after losing its lease")
		}
	case <-time.After(2 * ttl):
		t.Fatalf("hold still running %v after the server died; stderr:\n%s", 2*ttl, errb.String())
	}
	s.start()
	list, err := c.List(ctx, wire.ListRequest{Key: "hold-key"})
	if err != nil || len(list.Leases) != 1 {
		t.Fatalf("lease after restart: %v %+v", err, list)
	}
	l := list.Leases[0]
	last := l.AcquiredAt
	if l.LastRenewedAt != nil {
		last = *l.LastRenewedAt
	}
	if deadline := last.Add(ttl); !stopped.Before(deadline) {
		t.Fatalf("command stopped at %v, not before the lease's earliest expiry %v", stopped, deadline)
	}
}
