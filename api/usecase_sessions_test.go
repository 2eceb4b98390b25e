package api

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Session heartbeats (docs/use-cases.md): every playback session gets a lease with a TTL, the client heartbeats it
// (POST .../sessions/{id}/heartbeat), the session shows lease_expires_at,
// heartbeat_interval and last_heartbeat, an expired session stops and its
// resources (the tuner slot) are released, and expiry, heartbeats and late
// heartbeats are counted.
//
// Leasehold's sessions are that object: expires_at is lease_expires_at,
// heartbeat_interval_ms is heartbeat_interval (in ms rather than seconds),
// last_heartbeat is last_heartbeat; the tuner slot is a lease bound to the
// session, so it ends the moment the session does.

func TestUseCaseSessionHeartbeats(t *testing.T) {
	e := newUseCaseEnv(t, Options{})
	// 5 s: a heartbeat sent when two thirds remain has 3.3 s to arrive, and
	// the setup (a session and two leases bound to it) the whole TTL, on a
	// loaded machine where a request may stall for seconds (a heartbeat
	// that arrives late legitimately ends the session).
	const ttl = 5000 // ms
	m0 := e.metrics()
	w := watch(t, e, "holder=webui-client-1")

	created := time.Now()
	sess := e.session(201, "POST", "/v1/sessions", fmt.Sprintf(`{"holder":"webui-client-1","ttl_ms":%d,"metadata":{"service":"1:0:19:283D"}}`, ttl))
	answered := time.Now()
	hdr := []string{"X-Session-Token", sess.Token}
	path := "/v1/sessions/" + sess.SessionID

	t.Run("Session Start: lease created with TTL; the response carries lease_expires_at and heartbeat_interval", func(t *testing.T) {
		if sess.State != "active" || sess.TTLMS != ttl || sess.Token == "" {
			t.Fatalf("session = %+v", sess)
		}
		if sess.HeartbeatIntervalMS != ttl/3 {
			t.Fatalf("heartbeat_interval_ms = %d, want %d (TTL/3)", sess.HeartbeatIntervalMS, ttl/3)
		}
		if sess.RemainingMS <= 0 || sess.RemainingMS > ttl {
			t.Fatalf("remaining_ms = %d", sess.RemainingMS)
		}
		// expires_at is the server's now (between the request and its
		// answer) plus remaining_ms (at most the TTL).
		if d := sess.ExpiresAt.Sub(created); d <= 0 || sess.ExpiresAt.After(answered.Add(ttl*time.Millisecond)) {
			t.Fatalf("expires_at is %v after creation (answered %v after), TTL %d ms", d, answered.Sub(created), ttl)
		}
		// Creation counts as the first sign of life: last_heartbeat starts
		// at created_at, with no heartbeat counted yet.
		if sess.LastHeartbeat == nil || !sess.LastHeartbeat.Equal(sess.CreatedAt) || sess.HeartbeatCount != 0 {
			t.Fatalf("a new session's heartbeat fields: %+v", sess)
		}
	})

	// The session's resources: a tuner slot (two-tuner device) and the
	// dedup lease of its service, both bound to the session.
	tuner := e.lease(201, "POST", "/v1/leases", fmt.Sprintf(`{"key":"tuner","limit":2,"session_id":%q}`, sess.SessionID), hdr...)
	dedup := e.lease(201, "POST", "/v1/leases", fmt.Sprintf(`{"key":"service/1:0:19:283D","session_id":%q}`, sess.SessionID), hdr...)
	if tuner.Holder != "webui-client-1" || tuner.SessionID != sess.SessionID || tuner.TTLMS != ttl {
		t.Fatalf("bound tuner lease = %+v", tuner)
	}

	var lastSent time.Time
	beats := 0
	t.Run("Client Heartbeat: the lease is renewed and lease_expires_at extended; last_heartbeat recorded; idempotent", func(t *testing.T) {
		prev := sess
		// Heartbeat whenever two thirds of the TTL remain, for more than
		// two TTLs: the session outlives its TTL because of the heartbeats.
		for time.Since(created) < 2*ttl*time.Millisecond+200*time.Millisecond {
			pollUntil(t, 10*time.Second, "the session to need a heartbeat", func() bool {
				s := e.session(200, "GET", path, "")
				if s.State != "active" {
					t.Fatalf("session ended while heartbeating: %+v", s)
				}
				return s.RemainingMS <= ttl*2/3
			})
			lastSent = time.Now()
			got := e.session(200, "POST", path+"/heartbeat", "", hdr...)
			rtt := time.Since(lastSent)
			beats++
			if got.State != "active" || got.HeartbeatCount != uint64(beats) {
				t.Fatalf("heartbeat %d: %+v", beats, got)
			}
			if !got.ExpiresAt.After(prev.ExpiresAt) {
				t.Fatalf("heartbeat %d did not extend lease_expires_at: %v -> %v", beats, prev.ExpiresAt, got.ExpiresAt)
			}
			// The full TTL back when it was applied, less at most what
			// the cluster clock (never faster than real time) ran until
			// the answer was rendered.
			if floor := (ttl*time.Millisecond - rtt - 2*useCaseTick).Milliseconds(); got.RemainingMS < floor || got.RemainingMS > ttl {
				t.Fatalf("heartbeat %d: remaining_ms %d, want the full TTL back (%d..%d, answered in %v)", beats, got.RemainingMS, floor, ttl, rtt)
			}
			if got.LastHeartbeat == nil || got.LastHeartbeat.Before(created.Add(-time.Second)) {
				t.Fatalf("heartbeat %d: last_heartbeat %v", beats, got.LastHeartbeat)
			}
			prev = got
		}
		// Idempotent: a repeated heartbeat is just another renewal.
		lastSent = time.Now()
		again := e.session(200, "POST", path+"/heartbeat", "", hdr...)
		beats++
		if again.State != "active" || again.HeartbeatCount != uint64(beats) {
			t.Fatalf("repeated heartbeat: %+v", again)
		}
		// The bound leases live as long as the session.
		for _, id := range []string{tuner.LeaseID, dedup.LeaseID} {
			if l := e.lease(200, "GET", "/v1/leases/"+id, ""); l.State != "active" {
				t.Fatalf("bound lease %s: %s after %v (TTL %d ms)", id, l.State, time.Since(created), ttl)
			}
		}
		// GET shows the ADR's three fields.
		var raw map[string]json.RawMessage
		jsonOf(t, e.call("GET", path, ""), &raw)
		for _, f := range []string{"expires_at", "heartbeat_interval_ms", "last_heartbeat", "remaining_ms"} {
			if _, ok := raw[f]; !ok {
				t.Errorf("GET session lacks %s: %v", f, raw)
			}
		}
	})

	t.Run("Security: a heartbeat without the session's token changes nothing", func(t *testing.T) {
		wantError(t, e.call("POST", path+"/heartbeat", "", "X-Session-Token", "not-the-token"), 403, wire.CodeLeaseTokenInvalid, "")
		if s := e.session(200, "GET", path, ""); s.HeartbeatCount != uint64(beats) {
			t.Fatalf("heartbeat_count %d after a rejected heartbeat, want %d", s.HeartbeatCount, beats)
		}
	})

	var expiredAfter time.Duration
	var end wire.Event // the session's session_ended event
	t.Run("Lease Expiry: without heartbeats the session stops (reason expired) and its resources are released", func(t *testing.T) {
		// Only a hang guard: the cluster clock may run slower than real
		// time on a loaded machine (a tick waits for the last to apply).
		pollUntil(t, 120*time.Second, "the session to expire", func() bool {
			return e.session(200, "GET", path, "").State == "expired"
		})
		expiredAfter = time.Since(lastSent)
		s := e.session(200, "GET", path, "")
		if s.EndReason != "expired" || s.EndedAt == nil {
			t.Fatalf("expired session = %+v", s)
		}
		// Never before TTL since the last heartbeat was sent (the cluster
		// clock never runs faster than real time). The ADR's background
		// job runs every 10 s, so it promises expiry within TTL + 10 s;
		// Leasehold's bound is TTL + two ticks, counted on the cluster
		// clock (in wall time it stretches as far as a loaded machine
		// slows the clock): from the tick the last heartbeat applied at to
		// the tick of the session_ended event.
		if expiredAfter < ttl*time.Millisecond {
			t.Fatalf("expired %v after the last heartbeat was sent, TTL %d ms", expiredAfter, ttl)
		}
		end = w.next("session_ended", "")
		var last *wire.Event
		for i := range w.got {
			if ev := &w.got[i]; ev.Type == "session_heartbeat" && ev.Session != nil && ev.Session.SessionID == sess.SessionID {
				last = ev
			}
		}
		ttlTicks := uint64(ttl * time.Millisecond / useCaseTick)
		if last == nil || end.Tick < last.Tick+ttlTicks || end.Tick > last.Tick+ttlTicks+2 {
			t.Fatalf("session_ended at tick %d, last heartbeat event %+v: want TTL (%d ticks) to TTL + 2 ticks after it", end.Tick, last, ttlTicks)
		}
		t.Logf("session expired %d ticks after its last heartbeat (TTL %d ticks of %v), observed %v after it was sent",
			end.Tick-last.Tick, ttlTicks, useCaseTick, expiredAfter)
		for _, id := range []string{tuner.LeaseID, dedup.LeaseID} {
			l := e.lease(200, "GET", "/v1/leases/"+id, "")
			if l.State != "expired" || l.EndReason != "session_ended" {
				t.Fatalf("bound lease %s after session expiry: %s %q", id, l.State, l.EndReason)
			}
		}
		// The tuner slots are free again: another client gets both.
		for i := range 2 {
			e.lease(201, "POST", "/v1/leases", fmt.Sprintf(`{"key":"tuner","limit":2,"holder":"webui-client-2","ttl_ms":5000,"idempotency_key":"slot-%d"}`, i))
		}
		e.lease(201, "POST", "/v1/leases", `{"key":"service/1:0:19:283D","holder":"webui-client-2","ttl_ms":5000}`)
	})

	t.Run("a heartbeat after expiry is late: SESSION_ENDED, nothing revived", func(t *testing.T) {
		wantError(t, e.call("POST", path+"/heartbeat", "", hdr...), 409, wire.CodeSessionEnded, "")
		if s := e.session(200, "GET", path, ""); s.State != "expired" {
			t.Fatalf("a late heartbeat revived the session: %+v", s)
		}
	})

	t.Run("Metrics: sessions_lease_expired_total, sessions_heartbeat_total, sessions_heartbeat_late_total", func(t *testing.T) {
		m := e.metrics()
		for name, want := range map[string]float64{
			"leasehold_sessions_created_total":        1,
			"leasehold_sessions_expired_total":        1,
			"leasehold_session_heartbeats_total":      float64(beats),
			"leasehold_session_heartbeats_late_total": 1,
		} {
			if got := m[name] - m0[name]; got != want {
				t.Errorf("%s grew by %v, want %v", name, got, want)
			}
		}
		if m["leasehold_active_sessions"] != 0 {
			t.Errorf("active sessions = %v", m["leasehold_active_sessions"])
		}
	})

	t.Run("Logs and observability: the event stream shows the session's life, its expiry (reason expired) and its leases ending with it", func(t *testing.T) {
		if end.Session == nil || end.Session.SessionID != sess.SessionID || end.Reason != "expired" || end.Session.State != "expired" {
			t.Fatalf("session_ended event = %+v", end)
		}
		if end.Session.Token != "" {
			t.Fatal("a session event carries the token")
		}
		for _, id := range []string{tuner.LeaseID, dedup.LeaseID} {
			found := false
			for _, ev := range w.got {
				found = found || ev.Type == "expired" && ev.Lease != nil && ev.Lease.LeaseID == id
			}
			if !found {
				w.next("expired", id)
			}
		}
		counts := map[string]int{}
		for _, ev := range w.got {
			if ev.Session != nil && ev.Session.SessionID == sess.SessionID {
				counts[ev.Type]++
			}
		}
		if counts["session_created"] != 1 || counts["session_heartbeat"] != beats || counts["session_ended"] != 1 {
			t.Fatalf("session events = %v, want 1 created, %d heartbeats, 1 ended", counts, beats)
		}
	})
}
