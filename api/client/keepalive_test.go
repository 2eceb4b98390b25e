package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// renewLog records when a fake server received renewals it answered OK.
type renewLog struct {
	mu    sync.Mutex
	times []time.Time
}

func (l *renewLog) add(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.times = append(l.times, t)
}

func (l *renewLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.times)
}

func (l *renewLog) last() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.times[len(l.times)-1]
}

func activeLease(ttl time.Duration) *wire.Lease {
	return &wire.Lease{
		LeaseID: "ls_1", Key: "camera/7", Holder: "h", Limit: 1, State: "active", FencingToken: 42,
		TTLMS: ttl.Milliseconds(), RemainingMS: ttl.Milliseconds(), HeartbeatIntervalMS: ttl.Milliseconds() / 3,
		Token: "tok",
	}
}

// answerRenew answers a renewal as a healthy server does, after checking
// the request's shape.
func answerRenew(t *testing.T, w http.ResponseWriter, r *http.Request, ttl time.Duration) {
	io.Copy(io.Discard, r.Body)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/leases/ls_1/renew" || r.Header.Get("X-Lease-Token") != "tok" {
		t.Errorf("unexpected request %s %s token %q", r.Method, r.URL.Path, r.Header.Get("X-Lease-Token"))
	}
	l := activeLease(ttl)
	l.Token = ""
	writeJSON(w, 200, l)
}

// hang blocks a handler until the client gives up or the test ends.
func hang(t *testing.T) func(w http.ResponseWriter, r *http.Request) {
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) }) // runs before the servers close
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-unblock:
		}
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
}

// waitLost waits for Lost and returns when the test saw it closed.
func waitLost(t *testing.T, ka *KeepAlive, timeout time.Duration) time.Time {
	t.Helper()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-ka.Lost():
		return time.Now()
	case <-tm.C:
		t.Fatalf("lease not reported lost within %v", timeout)
		return time.Time{}
	}
}

func isLost(ka *KeepAlive) bool {
	select {
	case <-ka.Lost():
		return true
	default:
		return false
	}
}

func startKeepAlive(t *testing.T, c *Client, ttl time.Duration, opts KeepAliveOptions) *KeepAlive {
	t.Helper()
	ka, err := c.KeepAlive(context.Background(), activeLease(ttl), time.Now(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ka.Stop)
	return ka
}

func TestKeepAliveRenews(t *testing.T) {
	// Renewals every 400 ms keep the lease: only a machine stalled for
	// most of the TTL loses it.
	const ttl = 1200 * time.Millisecond
	var log renewLog
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		log.add(time.Now())
		answerRenew(t, w, r, ttl)
	})
	c := newClient(t, s.URL)
	started := time.Now()
	ka := startKeepAlive(t, c, ttl, KeepAliveOptions{})
	first := ka.Deadline()
	if ka.FencingToken() != 42 || ka.LeaseID() != "ls_1" || ka.Key() != "camera/7" {
		t.Errorf("lease facts: token %d id %q key %q", ka.FencingToken(), ka.LeaseID(), ka.Key())
	}
	waitFor(t, 3*time.Second, "three renewals", func() bool { return log.len() >= 3 })
	if isLost(ka) || ka.Err() != nil || ka.Context().Err() != nil {
		t.Fatalf("lost while the server renews: %v", ka.Err())
	}
	if !ka.Deadline().After(first) {
		t.Errorf("deadline did not move forward: %v then %v", first, ka.Deadline())
	}
	// Renewals are spaced by TTL/3, not hammered: their send times are at
	// least that far apart, so no more of them than that reached the
	// server by the last one's arrival. (Gaps between arrivals would not
	// do: a loaded machine delays one request and not the next.)
	log.mu.Lock()
	if n, most := len(log.times), int(log.times[len(log.times)-1].Sub(started)/(ttl/3))+1; n > most {
		t.Errorf("%d renewals within %v, at most %d at one per %v", n, log.times[n-1].Sub(started), most, ttl/3)
	}
	log.mu.Unlock()

	ka.Stop()
	if !isLost(ka) || !errors.Is(ka.Err(), ErrKeepAliveStopped) {
		t.Fatalf("after Stop: lost %v, err %v", isLost(ka), ka.Err())
	}
	if !errors.Is(context.Cause(ka.Context()), ErrKeepAliveStopped) {
		t.Errorf("context cause = %v", context.Cause(ka.Context()))
	}
	ka.Stop() // idempotent
}

func TestKeepAliveLostBeforeExpiryWhenServerHangs(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	var log renewLog
	hung := hang(t)
	var n atomic.Int64
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			log.add(time.Now())
			answerRenew(t, w, r, ttl)
			return
		}
		hung(w, r) // every later renewal hangs
	})
	c := newClient(t, s.URL)
	// A renew timeout far beyond the TTL: only the timer can report the loss.
	ka := startKeepAlive(t, c, ttl, KeepAliveOptions{RenewTimeout: time.Minute})
	lostAt := waitLost(t, ka, 10*time.Second)
	if log.len() != 1 {
		t.Fatalf("%d renewals answered, want 1", log.len())
	}
	// The server could end the lease no earlier than the TTL after it
	// received the last renewal; the holder must know before: its
	// deadline is the margin before that, and Lost closes at the deadline.
	// How soon after it the test sees Lost closed is the scheduler's
	// business (the margin is there to absorb it), so that delay has a
	// generous bound only.
	serverExpiry := log.last().Add(ttl)
	if want := serverExpiry.Add(-DefaultMargin(ttl)); ka.Deadline().After(want) {
		t.Errorf("deadline %v after receipt + TTL - margin", ka.Deadline().Sub(want))
	}
	if lostAt.Before(ka.Deadline()) {
		t.Errorf("lost reported %v before the deadline", ka.Deadline().Sub(lostAt))
	}
	if late := lostAt.Sub(ka.Deadline()); late > 5*time.Second {
		t.Errorf("lost reported %v after the deadline", late)
	}
	if !errors.Is(ka.Err(), ErrNotRenewed) {
		t.Errorf("err = %v, want ErrNotRenewed", ka.Err())
	}
	if !errors.Is(context.Cause(ka.Context()), ErrNotRenewed) {
		t.Errorf("context cause = %v", context.Cause(ka.Context()))
	}
}

func TestKeepAliveLostWhenServerNeverAnswers(t *testing.T) {
	const ttl = 300 * time.Millisecond
	s, _ := server(t, hang(t))
	c := newClient(t, s.URL)
	sent := time.Now()
	ka, err := c.KeepAlive(context.Background(), activeLease(ttl), sent, KeepAliveOptions{Margin: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Stop()
	lostAt := waitLost(t, ka, 3*time.Second)
	if !ka.Deadline().Equal(sent.Add(ttl)) {
		t.Errorf("deadline = sent + %v, want sent + TTL with no margin", ka.Deadline().Sub(sent))
	}
	if lostAt.Before(sent.Add(ttl)) {
		t.Errorf("lost %v before sent + TTL", sent.Add(ttl).Sub(lostAt))
	}
	if !errors.Is(ka.Err(), ErrNotRenewed) {
		t.Errorf("err = %v", ka.Err())
	}
}

func TestKeepAliveDeadlineCountsFromSendTime(t *testing.T) {
	// The answer comes 500 ms after the request; the lease is lost only
	// if it comes later than 1.7 s (a stalled machine).
	const ttl = 3 * time.Second
	const slow = 500 * time.Millisecond
	var log renewLog
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		log.add(time.Now())
		select { // a slow server: the answer arrives well after the request
		case <-time.After(slow):
		case <-r.Context().Done():
			return
		}
		answerRenew(t, w, r, ttl)
	})
	c := newClient(t, s.URL)
	ka := startKeepAlive(t, c, ttl, KeepAliveOptions{})
	first := ka.Deadline()
	waitFor(t, 10*time.Second, "a renewal to count", func() bool { return ka.Deadline().After(first) })
	received := log.last()
	if want := received.Add(ttl - DefaultMargin(ttl)); ka.Deadline().After(want) {
		t.Errorf("deadline is %v after receipt + TTL - margin: counted from the answer, not the send", ka.Deadline().Sub(want))
	}
}

func TestKeepAliveServerSaysLeaseIsGone(t *testing.T) {
	tests := []struct {
		name   string
		status int
		code   wire.Code
		state  string // answer 200 with a lease in this state instead
	}{
		{"expired", 409, wire.CodeLeaseExpired, ""},
		{"released", 409, wire.CodeLeaseReleased, ""},
		{"revoked", 409, wire.CodeLeaseRevoked, ""},
		{"token invalid", 403, wire.CodeLeaseTokenInvalid, ""},
		{"pruned", 404, wire.CodeLeaseNotFound, ""},
		{"answer says revoked", 200, wire.CodeLeaseRevoked, "revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if tt.state != "" {
					l := activeLease(time.Minute)
					l.State, l.Token = tt.state, ""
					writeJSON(w, 200, l)
					return
				}
				writeErr(w, tt.status, tt.code, "gone")
			})
			c := newClient(t, s.URL)
			// A long TTL with quick renewals: the loss must come from the
			// answer, long before the deadline.
			ka := startKeepAlive(t, c, time.Minute, KeepAliveOptions{Interval: 10 * time.Millisecond})
			waitLost(t, ka, 3*time.Second)
			if ErrorCode(ka.Err()) != tt.code {
				t.Errorf("err = %v, want code %s", ka.Err(), tt.code)
			}
			if errors.Is(ka.Err(), ErrNotRenewed) {
				t.Error("reported as not renewed")
			}
		})
	}
}

func TestKeepAliveRetriesTransientFailures(t *testing.T) {
	const ttl = 3 * time.Second // two failed attempts must not use it up
	var log renewLog
	var n atomic.Int64
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) <= 2 {
			writeErr(w, 503, wire.CodeNoLeader, "no leader")
			return
		}
		log.add(time.Now())
		answerRenew(t, w, r, ttl)
	})
	c := newClient(t, s.URL)
	var reported atomic.Int64
	ka := startKeepAlive(t, c, ttl, KeepAliveOptions{OnRenewError: func(err error) {
		if ErrorCode(err) != wire.CodeNoLeader {
			t.Errorf("reported error %v", err)
		}
		reported.Add(1)
	}})
	waitFor(t, 10*time.Second, "a renewal after two failures", func() bool { return log.len() >= 1 })
	if isLost(ka) {
		t.Fatalf("lost: %v", ka.Err())
	}
	if reported.Load() != 2 {
		t.Errorf("OnRenewError called %d times, want 2", reported.Load())
	}
}

func TestKeepAliveFailsOver(t *testing.T) {
	// An attempt timeout of 500 ms: long enough for the second node to
	// answer on a loaded machine, short enough for a renewal that lost
	// one attempt on the hung node to make it well within the TTL.
	const ttl = 3 * time.Second
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}
	tests := []struct {
		name  string
		first func(t *testing.T) http.HandlerFunc
	}{
		// A plain Renew stays on a node that hung up (TestFailover); the
		// keep-alive's renewal may move on: a duplicate is harmless.
		{"hang-up", func(*testing.T) http.HandlerFunc { return hangUp }},
		// A node that never answers costs one attempt timeout, not the
		// lease.
		{"hung node", func(t *testing.T) http.HandlerFunc { return hang(t) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s1, c1 := server(t, tt.first(t))
			var log renewLog
			s2, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
				log.add(time.Now())
				answerRenew(t, w, r, ttl)
			})
			c := newClient(t, s1.URL, s2.URL)
			// The renewal moves on within one attempt: no failure surfaces.
			ka := startKeepAlive(t, c, ttl, KeepAliveOptions{RenewTimeout: 500 * time.Millisecond, OnRenewError: func(err error) {
				t.Errorf("renewal failed instead of moving on: %v", err)
			}})
			waitFor(t, 10*time.Second, "two renewals on the second node", func() bool { return log.len() >= 2 })
			if isLost(ka) {
				t.Fatalf("lost: %v", ka.Err())
			}
			if c1.n.Load() != 1 {
				t.Errorf("first node saw %d renewals, want 1 (the client remembers the node that answered)", c1.n.Load())
			}
		})
	}
}

func TestKeepAliveContextEnds(t *testing.T) {
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) { answerRenew(t, w, r, time.Minute) })
	c := newClient(t, s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	ka, err := c.KeepAlive(ctx, activeLease(time.Minute), time.Now(), KeepAliveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	waitLost(t, ka, 3*time.Second)
	if !errors.Is(ka.Err(), context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", ka.Err())
	}
	ka.Stop()
}

func TestKeepAliveReleaseStopsWorkFirst(t *testing.T) {
	var ka atomic.Pointer[KeepAlive]
	released := make(chan string, 1)
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete {
			answerRenew(t, w, r, time.Minute)
			return
		}
		data, _ := io.ReadAll(r.Body)
		if !isLost(ka.Load()) {
			t.Error("release reached the server before Lost closed")
		}
		if r.URL.Path != "/v1/leases/ls_1" || r.Header.Get("X-Lease-Token") != "tok" {
			t.Errorf("release %s token %q", r.URL.Path, r.Header.Get("X-Lease-Token"))
		}
		released <- string(data)
		l := activeLease(time.Minute)
		l.State, l.Token = "released", ""
		writeJSON(w, 200, l)
	})
	c := newClient(t, s.URL)
	k, err := c.KeepAlive(context.Background(), activeLease(time.Minute), time.Now(), KeepAliveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ka.Store(k)
	if err := k.Release(context.Background(), "done"); err != nil {
		t.Fatal(err)
	}
	if body := <-released; !strings.Contains(body, `"done"`) {
		t.Errorf("release body %q lacks the reason", body)
	}
	if !errors.Is(k.Err(), ErrKeepAliveStopped) {
		t.Errorf("err = %v", k.Err())
	}
}

func TestKeepAliveDeadlineAlreadyPassed(t *testing.T) {
	s, c1 := server(t, func(w http.ResponseWriter, r *http.Request) { answerRenew(t, w, r, time.Second) })
	c := newClient(t, s.URL)
	ka, err := c.KeepAlive(context.Background(), activeLease(time.Second), time.Now().Add(-time.Second), KeepAliveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitLost(t, ka, 3*time.Second)
	ka.Stop()
	if !errors.Is(ka.Err(), ErrNotRenewed) {
		t.Errorf("err = %v", ka.Err())
	}
	if c1.n.Load() != 0 {
		t.Errorf("%d renewals sent for a lease past its deadline", c1.n.Load())
	}
}

func TestKeepAliveRejectsBadArguments(t *testing.T) {
	c := newClient(t, "127.0.0.1:1")
	now := time.Now()
	mod := func(f func(l *wire.Lease)) *wire.Lease {
		l := activeLease(time.Second)
		f(l)
		return l
	}
	tests := []struct {
		name  string
		lease *wire.Lease
		sent  time.Time
		opts  KeepAliveOptions
	}{
		{"nil lease", nil, now, KeepAliveOptions{}},
		{"no token", mod(func(l *wire.Lease) { l.Token = "" }), now, KeepAliveOptions{}},
		{"session-bound", mod(func(l *wire.Lease) { l.SessionID = "ss_1" }), now, KeepAliveOptions{}},
		{"ended", mod(func(l *wire.Lease) { l.State = "expired" }), now, KeepAliveOptions{}},
		{"no ttl", mod(func(l *wire.Lease) { l.TTLMS = 0 }), now, KeepAliveOptions{}},
		{"no send time", activeLease(time.Second), time.Time{}, KeepAliveOptions{}},
		{"margin as long as the ttl", activeLease(time.Second), now, KeepAliveOptions{Margin: time.Second}},
		{"interval past the deadline", activeLease(time.Second), now, KeepAliveOptions{Interval: 900 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ka, err := c.KeepAlive(context.Background(), tt.lease, tt.sent, tt.opts); err == nil {
				ka.Stop()
				t.Fatal("accepted")
			}
		})
	}
}

func TestDefaultMargin(t *testing.T) {
	for _, tt := range []struct{ ttl, want time.Duration }{
		{10 * time.Second, time.Second},
		{time.Second, 100 * time.Millisecond},
		{500 * time.Millisecond, 100 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond},
	} {
		if got := DefaultMargin(tt.ttl); got != tt.want {
			t.Errorf("DefaultMargin(%v) = %v, want %v", tt.ttl, got, tt.want)
		}
	}
}

func TestAcquireKeepAlive(t *testing.T) {
	// Margin 300 ms, so the holder may rely on the lease for 2.7 s, and a
	// renewal before returning is due once the acquire took over 1.35 s:
	// an acquire without a wait answers well within that on a loaded
	// machine, one that waited 1.6 s does not.
	const ttl = 3 * time.Second
	const longWait = 1600 * time.Millisecond
	type fake struct {
		acquireDelay time.Duration
		renewCode    wire.Code // "" answers OK
	}
	run := func(t *testing.T, f fake) (*KeepAlive, error, *renewLog, *atomic.Int64) {
		var log renewLog
		var releases atomic.Int64
		s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPost && r.URL.Path == "/v1/leases":
				io.Copy(io.Discard, r.Body)
				select { // the acquire waited for its slot this long
				case <-time.After(f.acquireDelay):
				case <-r.Context().Done():
					return
				}
				writeJSON(w, 201, activeLease(ttl))
			case r.Method == http.MethodDelete:
				io.Copy(io.Discard, r.Body)
				releases.Add(1)
				w.WriteHeader(204)
			case f.renewCode != "":
				io.Copy(io.Discard, r.Body)
				writeErr(w, 409, f.renewCode, "gone")
			default:
				log.add(time.Now())
				answerRenew(t, w, r, ttl)
			}
		})
		c := newClient(t, s.URL)
		ka, err := c.AcquireKeepAlive(context.Background(), wire.AcquireRequest{Key: "camera/7", Holder: "h", TTLMS: ttl.Milliseconds(), WaitMS: 5000}, KeepAliveOptions{})
		if ka != nil {
			t.Cleanup(ka.Stop)
		}
		return ka, err, &log, &releases
	}

	t.Run("plain", func(t *testing.T) {
		ka, err, log, _ := run(t, fake{})
		if err != nil {
			t.Fatal(err)
		}
		if log.len() != 0 {
			t.Errorf("%d renewals before returning, want none", log.len())
		}
		if ka.FencingToken() != 42 {
			t.Errorf("fencing token %d", ka.FencingToken())
		}
		waitFor(t, 10*time.Second, "renewals", func() bool { return log.len() >= 2 })
		if isLost(ka) {
			t.Fatal(ka.Err())
		}
	})
	t.Run("long wait renews first", func(t *testing.T) {
		// The acquire's answer comes so late that sent + TTL - margin is
		// almost over: without a renewal the lease would be lost at once.
		ka, err, log, _ := run(t, fake{acquireDelay: longWait})
		if err != nil {
			t.Fatal(err)
		}
		if log.len() != 1 {
			t.Fatalf("%d renewals before returning, want 1", log.len())
		}
		if left := time.Until(ka.Deadline()); left < (ttl-DefaultMargin(ttl))/2 {
			t.Errorf("only %v left before the deadline", left)
		}
		if isLost(ka) {
			t.Fatal(ka.Err())
		}
	})
	t.Run("long wait and renewal fails", func(t *testing.T) {
		ka, err, _, releases := run(t, fake{acquireDelay: longWait, renewCode: wire.CodeLeaseRevoked})
		if err == nil || ka != nil {
			t.Fatalf("ka %v, err %v; want an error", ka, err)
		}
		if ErrorCode(err) != wire.CodeLeaseRevoked {
			t.Errorf("err = %v", err)
		}
		if releases.Load() != 1 {
			t.Errorf("%d releases, want 1", releases.Load())
		}
	})
	t.Run("bound lease refused", func(t *testing.T) {
		c := newClient(t, "127.0.0.1:1")
		if _, err := c.AcquireKeepAlive(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", SessionID: "ss_1"}, KeepAliveOptions{}); err == nil {
			t.Fatal("accepted a session-bound acquire")
		}
	})
}

func TestKeepAliveRenewsEarlyWhenLittleIsLeft(t *testing.T) {
	const ttl = 10 * time.Second
	var log renewLog
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		log.add(time.Now())
		answerRenew(t, w, r, ttl)
	})
	c := newClient(t, s.URL)
	// The lease came with 2 s left, less than one renewal interval
	// (3.3 s): the deadline is 1 s away (margin 1 s), time enough for the
	// early renewal on a loaded machine.
	l := activeLease(ttl)
	l.RemainingMS = 2000
	sent := time.Now()
	ka, err := c.KeepAlive(context.Background(), l, sent, KeepAliveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Stop()
	if want := sent.Add(2*time.Second - DefaultMargin(ttl)); !ka.Deadline().Equal(want) {
		t.Errorf("deadline = sent + %v, want sent + remaining - margin", ka.Deadline().Sub(sent))
	}
	waitFor(t, 3*time.Second, "an early renewal", func() bool { return log.len() >= 1 })
	if isLost(ka) {
		t.Fatal(ka.Err())
	}
	waitFor(t, 10*time.Second, "the renewal to count", func() bool { return ka.Deadline().Sub(sent) > 2*time.Second })
}

// TestKeepAliveSession: a session is kept alive by its heartbeat (with a
// node answering 503 in the list), with the session token, and reported lost
// when the server says it ended, whether by an error or by its state.
func TestKeepAliveSession(t *testing.T) {
	for _, ended := range []string{"error", "state"} {
		t.Run(ended, func(t *testing.T) {
			var beats atomic.Int64
			handler := func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.Method != http.MethodPost || r.URL.Path != "/v1/sessions/ss_1/heartbeat" || r.Header.Get("X-Session-Token") != "stok" {
					t.Errorf("unexpected request %s %s token %q", r.Method, r.URL.Path, r.Header.Get("X-Session-Token"))
				}
				switch n := beats.Add(1); {
				case n < 3:
					writeJSON(w, 200, wire.Session{SessionID: "ss_1", State: "active", TTLMS: 60_000, RemainingMS: 60_000})
				case ended == "state":
					writeJSON(w, 200, wire.Session{SessionID: "ss_1", State: "ended"})
				default:
					writeErr(w, 409, wire.CodeSessionEnded, "ended")
				}
			}
			down, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				writeErr(w, 503, wire.CodeNoLeader, "no leader")
			})
			up, _ := server(t, handler)
			c, err := New([]string{down.URL, up.URL}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			s := &wire.Session{SessionID: "ss_1", Holder: "h", State: "active", TTLMS: 60_000, RemainingMS: 60_000, Token: "stok"}
			ka, err := c.KeepAliveSession(context.Background(), s, time.Now(), KeepAliveOptions{Interval: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ka.Stop)
			if ka.LeaseID() != "ss_1" {
				t.Errorf("LeaseID %q, want the session id", ka.LeaseID())
			}
			waitLost(t, ka, 10*time.Second)
			if ErrorCode(ka.Err()) != wire.CodeSessionEnded {
				t.Errorf("err = %v, want SESSION_ENDED", ka.Err())
			}
			if beats.Load() < 3 {
				t.Errorf("%d heartbeats reached the live node, want 3", beats.Load())
			}
		})
	}
}
