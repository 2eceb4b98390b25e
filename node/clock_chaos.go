//go:build chaos

package node

import (
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"
)

// A build with the `chaos` tag has a clock the chaos suite controls: when
// LEASEHOLD_CHAOS_CLOCK names a file, the node reads it about every 20 ms:
//
//	{"wall_offset_ns": <int64>, "mono_rate": <float64>,
//	 "disk_stall": <bool>, "disk_delay_ns": <int64>}
//
// wall_offset_ns shifts every wall-clock reading (what only ends up in
// display fields); mono_rate makes the monotonic clock, and so the tick
// loop's period and timers, run at that rate relative to real time. A
// missing file, a missing field or a rate that is not positive and finite
// means no fault. disk_stall and disk_delay_ns stall or slow every write to
// Raft's log and stable store (disk_chaos.go). Normal builds contain none
// of this (a test checks the binary for chaosClockMarker).

// chaosClockEnv names the environment variable that points at the file.
const chaosClockEnv = "LEASEHOLD_CHAOS_CLOCK"

// chaosClockMarker is logged when the chaos clock is on; its symbol is how
// a test tells a chaos build from a normal one.
var chaosClockMarker = "chaos clock active: wall-clock offset and monotonic rate come from " + chaosClockEnv

// chaosPoll is how often the file is read, and the longest a timer sleeps
// before it looks at the rate again.
const chaosPoll = 20 * time.Millisecond

// chaosFault is the file's content.
type chaosFault struct {
	WallOffsetNS int64   `json:"wall_offset_ns"`
	MonoRate     float64 `json:"mono_rate"`
	DiskStall    bool    `json:"disk_stall"`
	DiskDelayNS  int64   `json:"disk_delay_ns"`
}

// chaosClock is a clock with a wall offset and a monotonic rate. Virtual
// monotonic time is piecewise linear in real time: at baseReal it was
// baseVirt past origin, and it runs at rate since.
type chaosClock struct {
	path string
	real func() time.Time // the real clock (tests substitute it)

	mu       sync.Mutex
	offset   time.Duration
	rate     float64
	origin   time.Time
	baseReal time.Time
	baseVirt time.Duration
	lastErr  string
}

func newChaosClock(path string, real func() time.Time) *chaosClock {
	now := real()
	return &chaosClock{path: path, real: real, rate: 1, origin: now, baseReal: now}
}

// wall is the real wall clock shifted by the offset.
func (c *chaosClock) wall() time.Time {
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return c.real().Add(off).Round(0)
}

// mono is the virtual monotonic time.
func (c *chaosClock) mono() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.origin.Add(c.virtLocked(c.real()))
}

func (c *chaosClock) virtLocked(now time.Time) time.Duration {
	return c.baseVirt + time.Duration(float64(now.Sub(c.baseReal))*c.rate)
}

func (c *chaosClock) currentRate() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rate
}

// set applies a fault: the rate changes from now on, never retroactively.
func (c *chaosClock) set(f chaosFault) {
	rate := f.MonoRate
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		rate = 1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = time.Duration(f.WallOffsetNS)
	if rate != c.rate {
		now := c.real()
		c.baseVirt, c.baseReal, c.rate = c.virtLocked(now), now, rate
	}
}

// poll reads the file once. A missing or unreadable file is no fault; the
// error (other than a missing file) is returned when it is new, for logging.
func (c *chaosClock) poll() error {
	var f chaosFault
	b, err := os.ReadFile(c.path)
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	c.set(f) // on any error: zero fault
	setChaosDisk(f)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		c.mu.Lock()
		c.lastErr = ""
		c.mu.Unlock()
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err.Error() == c.lastErr {
		return nil
	}
	c.lastErr = err.Error()
	return err
}

// The process's chaos clock: installed by the first node opened with
// LEASEHOLD_CHAOS_CLOCK set, removed when the last one closes.
var (
	chaosMu    sync.Mutex
	chaosUsers int
	chaosStop  chan struct{}
	chaosDone  chan struct{}
	chaosCur   *chaosClock // read without chaosMu only through activeChaos
	chaosCurMu sync.RWMutex
)

func activeChaos() *chaosClock {
	chaosCurMu.RLock()
	defer chaosCurMu.RUnlock()
	return chaosCur
}

func startClock(log *slog.Logger) (stop func()) {
	path := os.Getenv(chaosClockEnv)
	if path == "" {
		return func() {}
	}
	log.Warn(chaosClockMarker, "file", path)
	chaosMu.Lock()
	defer chaosMu.Unlock()
	chaosUsers++
	if chaosUsers == 1 {
		c := newChaosClock(path, time.Now)
		if err := c.poll(); err != nil {
			log.Warn("chaos clock: cannot read the fault file; no fault until it can", "file", path, "err", err)
		}
		chaosCurMu.Lock()
		chaosCur = c
		chaosCurMu.Unlock()
		chaosStop, chaosDone = make(chan struct{}), make(chan struct{})
		go pollChaos(c, log, chaosStop, chaosDone)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			chaosMu.Lock()
			defer chaosMu.Unlock()
			chaosUsers--
			if chaosUsers == 0 {
				close(chaosStop)
				<-chaosDone
				chaosCurMu.Lock()
				chaosCur = nil
				chaosCurMu.Unlock()
			}
		})
	}
}

func pollChaos(c *chaosClock, log *slog.Logger, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(chaosPoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if err := c.poll(); err != nil {
				log.Warn("chaos clock: cannot read the fault file; no fault until it can", "file", c.path, "err", err)
			}
		}
	}
}

func wallNow() time.Time {
	if c := activeChaos(); c != nil {
		return c.wall()
	}
	return time.Now()
}

func monoNow() time.Time {
	if c := activeChaos(); c != nil {
		return c.mono()
	}
	return time.Now()
}

// clockTimer is a timer on the (virtual) monotonic clock: it sleeps in real
// time at most chaosPoll at a stretch and looks at the clock again, so a
// rate change takes effect within that. Like time.Timer since Go 1.23, no
// stale value is received after Reset or Stop returns.
type clockTimer struct {
	C <-chan time.Time
	c chan time.Time

	mu       sync.Mutex
	gen      uint64
	active   bool
	deadline time.Time // on monoNow's scale
	real     *time.Timer
}

func newClockTimer(d time.Duration) *clockTimer {
	t := &clockTimer{c: make(chan time.Time, 1)}
	t.C = t.c
	t.Reset(d)
	return t
}

// Reset makes the timer fire d from now (virtual time) and reports whether
// it was active.
func (t *clockTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.stopLocked()
	t.active = true
	t.deadline = monoNow().Add(d)
	t.armLocked()
	return was
}

// Stop stops the timer and reports whether it was active.
func (t *clockTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopLocked()
}

func (t *clockTimer) stopLocked() bool {
	was := t.active
	t.active = false
	t.gen++
	if t.real != nil {
		t.real.Stop()
		t.real = nil
	}
	select {
	case <-t.c:
	default:
	}
	return was
}

func (t *clockTimer) armLocked() {
	now := monoNow()
	left := t.deadline.Sub(now)
	if left <= 0 {
		t.active = false
		select {
		case t.c <- now:
		default:
		}
		return
	}
	wait := left
	if c := activeChaos(); c != nil {
		wait = min(time.Duration(float64(left)/c.currentRate()), chaosPoll)
	}
	gen := t.gen
	t.real = time.AfterFunc(max(wait, time.Millisecond), func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.gen == gen && t.active {
			t.armLocked()
		}
	})
}
