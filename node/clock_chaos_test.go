//go:build chaos

package node

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// logBuf collects a node's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLogger(_ *testing.T) (*slog.Logger, *logBuf) {
	b := &logBuf{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// fakeReal is a real clock the test moves by hand.
type fakeReal struct {
	mu  sync.Mutex
	now time.Time
}

func (f *fakeReal) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeReal) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func writeFault(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestChaosClockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clock.json")
	real := &fakeReal{now: time.Now()}
	c := newChaosClock(path, real.Now)
	m0 := c.mono()
	// Missing file: no fault.
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	real.advance(100 * time.Millisecond)
	if got := c.mono().Sub(m0); got != 100*time.Millisecond {
		t.Fatalf("no fault: monotonic moved %v in 100ms", got)
	}
	if got := c.wall().Sub(real.Now()); got != 0 {
		t.Fatalf("no fault: wall offset %v", got)
	}

	writeFault(t, path, `{"wall_offset_ns": 3600000000000, "mono_rate": 4}`)
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	m1 := c.mono()
	real.advance(100 * time.Millisecond)
	if got := c.mono().Sub(m1); got != 400*time.Millisecond {
		t.Fatalf("rate 4: monotonic moved %v in 100ms, want 400ms", got)
	}
	if got := c.wall().Sub(real.Now()); got != time.Hour {
		t.Fatalf("wall offset %v, want 1h", got)
	}
	// The rate changes from now on, never retroactively; monotonic time
	// never goes back, whatever the wall clock does.
	writeFault(t, path, `{"wall_offset_ns": -7200000000000, "mono_rate": 0.5}`)
	m2 := c.mono()
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	if got := c.mono().Sub(m2); got != 0 {
		t.Fatalf("a rate change moved the monotonic clock by %v", got)
	}
	real.advance(100 * time.Millisecond)
	if got := c.mono().Sub(m2); got != 50*time.Millisecond {
		t.Fatalf("rate 0.5: monotonic moved %v in 100ms, want 50ms", got)
	}
	if got := c.wall().Sub(real.Now()); got != -2*time.Hour {
		t.Fatalf("wall offset %v, want -2h", got)
	}

	// Missing fields, bad rates, a bad file, a removed file: no fault.
	for _, body := range []string{`{}`, `{"mono_rate": 0}`, `{"mono_rate": -3}`, `{"wall_offset_ns": 5}`, `not json`} {
		writeFault(t, path, body)
		err := c.poll()
		if (err != nil) != (body == "not json") {
			t.Fatalf("%s: poll error %v", body, err)
		}
		if c.currentRate() != 1 {
			t.Fatalf("%s: rate %v, want 1", body, c.currentRate())
		}
		want := time.Duration(0)
		if body == `{"wall_offset_ns": 5}` {
			want = 5
		}
		if got := c.wall().Sub(real.Now()); got != want {
			t.Fatalf("%s: wall offset %v, want %v", body, got, want)
		}
	}
	if err := c.poll(); err != nil { // the same bad file: reported once
		t.Fatalf("a bad file reported twice: %v", err)
	}
	writeFault(t, path, `{"mono_rate": 3}`)
	if err := c.poll(); err != nil || c.currentRate() != 3 {
		t.Fatalf("rate %v, err %v", c.currentRate(), err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := c.poll(); err != nil || c.currentRate() != 1 {
		t.Fatalf("removed file: rate %v, err %v", c.currentRate(), err)
	}
}

// startChaos installs the process's chaos clock on a fault file, as a
// node's Open does.
func startChaos(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "clock.json")
	writeFault(t, path, body)
	t.Setenv(chaosClockEnv, path)
	return path
}

// TestChaosClockTimer: timers run on the virtual monotonic clock.
func TestChaosClockTimer(t *testing.T) {
	startChaos(t, `{"mono_rate": 20}`)
	log, _ := testLogger(t)
	stop := startClock(log)
	defer stop()
	if activeChaos() == nil {
		t.Fatal("no chaos clock installed")
	}
	start := time.Now()
	tm := newClockTimer(2 * time.Second) // 100 ms of real time at rate 20
	select {
	case <-tm.C:
	case <-time.After(10 * time.Second):
		t.Fatal("a 2 s timer at rate 20 did not fire within 10 s")
	}
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("a 2 s timer at rate 20 took %v of real time", took)
	}
	// Slowed down, a timer fires no sooner than the rate says.
	path := os.Getenv(chaosClockEnv)
	writeFault(t, path, `{"mono_rate": 0.2}`)
	waitFor(t, 5*time.Second, func() bool { return activeChaos().currentRate() == 0.2 })
	start = time.Now()
	tm.Reset(100 * time.Millisecond) // 500 ms of real time at rate 0.2
	select {
	case <-tm.C:
	case <-time.After(10 * time.Second):
		t.Fatal("a 100 ms timer at rate 0.2 did not fire within 10 s")
	}
	if took := time.Since(start); took < 450*time.Millisecond {
		t.Fatalf("a 100 ms timer at rate 0.2 fired after %v of real time", took)
	}
	// Stop: nothing arrives.
	tm.Reset(time.Millisecond)
	if !tm.Stop() {
		// It may have fired already; then nothing is left in C either.
		select {
		case <-tm.C:
			t.Fatal("a value in C after Stop")
		default:
		}
	}
}

// TestChaosClockNode: a wall-clock jump shows in display fields only:
// remaining time and expiry do not move. A faster monotonic clock makes the
// leader tick faster than real time, a slower one slower.
func TestChaosClockNode(t *testing.T) {
	path := startChaos(t, `{"wall_offset_ns": 3600000000000}`)
	cfg := testConfig(t, "")
	cfg.TickPeriod = 100 * time.Millisecond
	var logs *logBuf
	cfg.Logger, logs = testLogger(t)
	n := openNode(t, cfg)
	if got := strings.Count(logs.String(), chaosClockMarker); got != 1 {
		t.Fatalf("the chaos clock warning appears %d times in the log:\n%s", got, logs)
	}
	ctx := context.Background()
	sent := time.Now()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "clock/1", Holder: "w", TTLMS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if skew := l.AcquiredAt.Sub(sent); skew < 59*time.Minute || skew > 61*time.Minute {
		t.Fatalf("acquired_at %v is %v from now; want the 1h offset", l.AcquiredAt, skew)
	}
	// The countdown is the TTL less the ticks since the grant: no more
	// than the real time since the send allows (ticks never run ahead of
	// it; one tick of rounding), however late a loaded machine renders it.
	if floor := 1000 - time.Since(sent).Milliseconds() - 100; l.RemainingMS < floor || l.RemainingMS > 1000 {
		t.Fatalf("remaining_ms %d with a 1000 ms TTL, want %d..1000", l.RemainingMS, floor)
	}
	// Jump back two hours mid-lease: expiry does not care.
	writeFault(t, path, `{"wall_offset_ns": -3600000000000}`)
	var ended time.Time
	waitFor(t, 10*time.Second, func() bool {
		got, err := n.GetLease(ctx, l.LeaseID, true)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == "active" {
			return false
		}
		ended = time.Now()
		if got.State != "expired" {
			t.Fatalf("lease %s", got.State)
		}
		return true
	})
	if life := ended.Sub(sent); life < time.Second {
		t.Fatalf("a 1 s lease expired after %v of real time, across a wall-clock jump", life)
	}

	tickAt := func() uint64 {
		n.rep.mu.RLock()
		defer n.rep.mu.RUnlock()
		return n.rep.f.Tick()
	}
	ticksIn := func(rate string, d time.Duration) uint64 {
		writeFault(t, path, `{"mono_rate": `+rate+`}`)
		want, _ := strconv.ParseFloat(rate, 64)
		waitFor(t, 5*time.Second, func() bool { return activeChaos().currentRate() == want })
		// Let one period at the new rate pass so that the tick loop's
		// current wait was armed at it.
		t0 := tickAt()
		waitFor(t, 10*time.Second, func() bool { return tickAt() >= t0+2 })
		start, from := time.Now(), tickAt()
		deadline := start.Add(d)
		for time.Now().Before(deadline) {
			<-time.After(10 * time.Millisecond)
		}
		return tickAt() - from
	}
	// At rate 5 a 100 ms period is 20 ms of real time: far more than the
	// 10 ticks a second that real time allows.
	if got := ticksIn("5", time.Second); got <= 15 {
		t.Fatalf("rate 5: %d ticks in 1 s of real time; want more than 15", got)
	}
	// At rate 0.25 it is 400 ms: at most 3 in a second (one may follow a
	// stall quickly).
	if got := ticksIn("0.25", time.Second); got > 4 {
		t.Fatalf("rate 0.25: %d ticks in 1 s of real time; want at most 4", got)
	}
}

// TestChaosClockDiskFault: the fault file's disk_stall holds a node's
// Raft writes (a write waits, and the node commits nothing) until it is
// cleared; disk_delay_ns slows them.
func TestChaosClockDiskFault(t *testing.T) {
	path := startChaos(t, `{}`)
	cfg := testConfig(t, "")
	n := openNode(t, cfg)
	t.Cleanup(func() { chaosDisk.Set(false, 0) }) // before the node closes
	ctx := context.Background()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "a", Holder: "h", TTLMS: 1000}); err != nil {
		t.Fatal(err)
	}
	writeFault(t, path, `{"disk_stall": true}`)
	waitFor(t, 5*time.Second, chaosDisk.Stalled)
	done := make(chan error, 1)
	go func() {
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "b", Holder: "h", TTLMS: 1000})
		done <- err
	}()
	waitFor(t, 5*time.Second, func() bool { return chaosDisk.Waiting() > 0 })
	select {
	case err := <-done:
		t.Fatalf("a write completed on a stalled disk: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	writeFault(t, path, `{"disk_delay_ns": 1000000}`)
	waitFor(t, 5*time.Second, func() bool { return !chaosDisk.Stalled() })
	if err := <-done; err != nil {
		t.Fatalf("the held write after the stall: %v", err)
	}
	writeFault(t, path, `{}`)
}
