package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// helperEnv makes the test binary act as the command hold runs; see
// TestMain. helperArg, as the first argument, does the same with the
// helper's name as the second (helperCommand): that leaves the test's
// environment alone, so the test may run in parallel.
const (
	helperEnv = "LEASEHOLD_TEST_HELPER"
	helperArg = "leasehold-test-helper"
)

// helperCommand is the command line of the test binary acting as helper.
func helperCommand(t *testing.T, helper string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, helperArg, helper}
}

func TestMain(m *testing.M) {
	helper := os.Getenv(helperEnv)
	if len(os.Args) == 3 && os.Args[1] == helperArg {
		helper = os.Args[2]
	}
	switch helper {
	case "":
		os.Exit(m.Run())
	case "exit3":
		for _, k := range []string{"LEASEHOLD_FENCING_TOKEN", "LEASEHOLD_LEASE_ID", "LEASEHOLD_KEY"} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		os.Exit(3)
	case "block":
		// Runs until a signal's default action ends it.
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGUSR1)
		<-c
		os.Exit(0)
	case "memlimit":
		// Waits until the test has moved it into a cgroup, then sets the
		// memory limit as the server does and reports it.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		cg, err := containerMemLimit()
		relaxGC()
		fmt.Printf("cgroup=%d err=%v soft=%d\n", cg, err, debug.SetMemoryLimit(-1))
		os.Exit(0)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGUSR1)
		<-c
		os.Exit(0)
	}
	os.Exit(99)
}

// fakeLeaseServer answers acquire, renew and release for lease ls_1.
type fakeLeaseServer struct {
	ttl      time.Duration
	renew    func() (int, string) // status and body of a renewal
	renewals chan struct{}
	released chan http.Header // headers of each release, stamped with X-Test-Received
	mu       sync.Mutex
	acquired time.Time
}

func (f *fakeLeaseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/leases":
		f.mu.Lock()
		f.acquired = time.Now()
		f.mu.Unlock()
		writeJSONTest(w, 201, wire.Lease{LeaseID: "ls_1", Key: "k", State: "active", FencingToken: 99, Token: "tok",
			TTLMS: f.ttl.Milliseconds(), RemainingMS: f.ttl.Milliseconds(), HeartbeatIntervalMS: f.ttl.Milliseconds() / 3})
	case r.Method == "POST" && r.URL.Path == "/v1/leases/ls_1/renew":
		select {
		case f.renewals <- struct{}{}:
		default:
		}
		status, body := f.renew()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	case r.Method == "DELETE" && r.URL.Path == "/v1/leases/ls_1":
		h := r.Header.Clone()
		h.Set("X-Test-Received", time.Now().Format(time.RFC3339Nano))
		f.released <- h
		writeJSONTest(w, 200, wire.Lease{LeaseID: "ls_1", State: "released"})
	default:
		w.WriteHeader(404)
	}
}

func renewOK(ttl time.Duration) func() (int, string) {
	return func() (int, string) {
		return 200, fmt.Sprintf(`{"lease_id":"ls_1","state":"active","remaining_ms":%d}`, ttl.Milliseconds())
	}
}

func renewFails(status int, code string) func() (int, string) {
	return func() (int, string) {
		return status, fmt.Sprintf(`{"error":{"code":%q,"message":"test"}}`, code)
	}
}

func startHold(t *testing.T, helper string, ttl time.Duration, renew func() (int, string)) (*fakeLeaseServer, *bytes.Buffer, chan os.Signal, <-chan error) {
	t.Helper()
	f := &fakeLeaseServer{ttl: ttl, renew: renew, renewals: make(chan struct{}, 100), released: make(chan http.Header, 10)}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	command := helperCommand(t, helper)
	go func() {
		done <- holdRun(context.Background(), c, holdOptions{
			key: "k", holder: "h", ttl: ttl, command: command,
			stdout: &out, stderr: &errb,
		}, sigs)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hold stderr:\n%s", errb.String())
		}
	})
	return f, &out, sigs, done
}

func waitDone(t *testing.T, done <-chan error, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("hold did not finish within %v", limit)
		return nil
	}
}

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if err == nil {
		return 0
	}
	return -1
}

func TestHoldRunsCommandAndReleases(t *testing.T) {
	t.Parallel() // a fake server and a child process of its own
	ttl := 3 * time.Second
	f, out, _, done := startHold(t, "exit3", ttl, renewOK(ttl))
	err := waitDone(t, done, 10*time.Second)
	if exitCode(err) != 3 {
		t.Fatalf("err = %v, want exit status 3", err)
	}
	for _, want := range []string{"LEASEHOLD_FENCING_TOKEN=99", "LEASEHOLD_LEASE_ID=ls_1", "LEASEHOLD_KEY=k"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("command output %q lacks %s", out, want)
		}
	}
	select {
	case h := <-f.released:
		if h.Get("X-Lease-Token") != "tok" {
			t.Errorf("release sent token %q", h.Get("X-Lease-Token"))
		}
	default:
		t.Error("the lease was not released")
	}
}

func TestHoldRenewsAndForwardsSignals(t *testing.T) {
	t.Parallel() // a fake server and a child process of its own
	ttl := 1500 * time.Millisecond
	f, _, sigs, done := startHold(t, "block", ttl, renewOK(ttl))
	// Renewals every TTL/3 keep the command running past its first
	// deadline (1.35s).
	for range 5 {
		select {
		case <-f.renewals:
		case err := <-done:
			t.Fatalf("hold ended early: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal")
		}
	}
	sigs <- syscall.SIGTERM
	err := waitDone(t, done, 10*time.Second)
	if exitCode(err) != 128+int(syscall.SIGTERM) {
		t.Fatalf("err = %v, want exit status %d", err, 128+int(syscall.SIGTERM))
	}
	select {
	case <-f.released:
	default:
		t.Error("the lease was not released")
	}
}

// holdStopsBeforeExpiry checks that when renewals fail the command is gone
// before the lease could expire: before (acquire sent + TTL), and the
// acquire was sent after start. Hold releases the lease only once the
// command has exited, so the release's arrival bounds the command's end.
func holdStopsBeforeExpiry(t *testing.T, helper string, renew func() (int, string), within time.Duration) {
	start := time.Now()
	f, _, _, done := startHold(t, helper, holdTestTTL, renew)
	err := waitDone(t, done, 3*holdTestTTL)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("err = %v, want exit 1 for a lost lease", err)
	}
	var h http.Header
	select {
	case h = <-f.released:
	default:
		t.Fatal("no release after the command ended")
	}
	gone, _ := time.Parse(time.RFC3339Nano, h.Get("X-Test-Received"))
	if took := gone.Sub(start); took >= within {
		t.Fatalf("command ended %v after start; must be before %v", took, within)
	}
}

// holdTestTTL: stop at 7.2s, SIGKILL at 7.6s, expiry no earlier than 8s.
// The margin (TTL/10) is what absorbs a loaded machine under -race: after
// the SIGKILL, the command's death, hold noticing it and its release
// reaching the server get half of it, 400 ms (with a 3 s TTL that was
// 150 ms, less than a saturated machine may delay one goroutine).
const holdTestTTL = 8 * time.Second

func TestHoldStopsCommandWhenRenewalsFail(t *testing.T) {
	t.Parallel() // a fake server and a child process of its own
	holdStopsBeforeExpiry(t, "block", renewFails(503, "NO_LEADER"), holdTestTTL)
}

func TestHoldKillsCommandThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel() // a fake server and a child process of its own
	holdStopsBeforeExpiry(t, "ignore-term", renewFails(503, "NO_LEADER"), holdTestTTL)
}

func TestHoldStopsAtOnceWhenLeaseRevoked(t *testing.T) {
	t.Parallel() // a fake server and a child process of its own
	// The first renewal, at TTL/3, learns the lease is gone: no waiting for
	// the deadline.
	holdStopsBeforeExpiry(t, "block", renewFails(409, "LEASE_REVOKED"), holdTestTTL*3/4)
}
