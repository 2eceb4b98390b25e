package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Tuner slots (docs/use-cases.md): the worker is the sole owner of leases. Starting a stream takes a dedup lease
// per service and one of N tuner slots, under an idempotency key derived
// from SHA256("v1:stream.start:<ServiceRef>:<Profile>:<Bucket>"); a worker
// restarted after kill -9 frees its previous incarnation's leases at once;
// auth rejections have no side effects.
//
// The worker here is the test: it calls Leasehold the way the gateway's
// Orchestrator.handleStart would, with a write-scoped token, and its
// OnStartup hook calls POST /v1/holders/:holder/release with its own
// token, a write token scoped to its holder name (no admin token).

// gateway is one worker of the streaming gateway.
type gateway struct {
	e      *useCaseEnv
	holder string
	tuners int // tuner slots of the device
}

// intentKey is the ADR's server-side idempotency key (section 3.3).
func intentKey(sref, profile, bucket string) string {
	sum := sha256.Sum256([]byte("v1:stream.start:" + sref + ":" + profile + ":" + bucket))
	return hex.EncodeToString(sum[:])
}

// startResult is what handleStart did for one intent.
type startResult struct {
	dedup, tuner wire.Lease
	status       int    // of the dedup acquire: 201 new, 200 replay, 409 busy
	outcome      string // "running", "R_LEASE_BUSY", "REJECTED_NO_TUNER"
	busy         *wire.Error
}

// handleStart is section 3.2: the dedup lease lease:service:{sRef}, then a
// tuner slot (one semaphore key with a limit of the tuner count), both
// under the intent's idempotency key, so that a retried or concurrent
// identical intent finds the same leases. lockDelay is passed to both.
func (g *gateway) handleStart(sref, profile, bucket string, lockDelayMS int) startResult {
	g.e.t.Helper()
	idem := intentKey(sref, profile, bucket)
	body := fmt.Sprintf(`{"key":"lease:service:%s","holder":%q,"ttl_ms":30000,"idempotency_key":%q,"lock_delay_ms":%d,"metadata":{"profile":%q,"bucket":%q}}`,
		sref, g.holder, idem, lockDelayMS, profile, bucket)
	rec := g.e.call("POST", "/v1/leases", body, "Authorization", "Bearer "+writeToken)
	var r startResult
	r.status = rec.Code
	switch rec.Code {
	case 200, 201:
		jsonOf(g.e.t, rec, &r.dedup)
	case 409:
		r.busy = errorOf(g.e.t, rec)
		r.outcome = "R_LEASE_BUSY"
		return r
	default:
		g.e.t.Fatalf("dedup acquire: %d %s", rec.Code, rec.Body)
	}
	body = fmt.Sprintf(`{"key":"lease:tuner","holder":%q,"ttl_ms":30000,"limit":%d,"idempotency_key":%q,"lock_delay_ms":%d,"metadata":{"service":%q}}`,
		g.holder, g.tuners, idem+":tuner", lockDelayMS, sref)
	rec = g.e.call("POST", "/v1/leases", body, "Authorization", "Bearer "+writeToken)
	switch rec.Code {
	case 200, 201:
		jsonOf(g.e.t, rec, &r.tuner)
		r.outcome = "running"
	case 409:
		r.busy = errorOf(g.e.t, rec)
		r.outcome = "REJECTED_NO_TUNER"
		// Cleanup (step 5): release the dedup lease on error.
		rel := g.e.call("DELETE", "/v1/leases/"+r.dedup.LeaseID+"?reason=no_tuner", "",
			"Authorization", "Bearer "+writeToken, "X-Lease-Token", r.dedup.Token)
		if rel.Code != 200 {
			g.e.t.Fatalf("release dedup after REJECTED_NO_TUNER: %d %s", rel.Code, rel.Body)
		}
	default:
		g.e.t.Fatalf("tuner acquire: %d %s", rec.Code, rec.Body)
	}
	return r
}

// activeTuners lists the active tuner leases.
func (g *gateway) activeTuners() []*wire.Lease {
	return g.e.list("key=lease:tuner&state=active", "Authorization", "Bearer "+readToken)
}

func TestUseCaseTunerSlots(t *testing.T) {
	const workerBToken = "worker-b-secret-0123456789"
	e := newUseCaseEnv(t, Options{Tokens: tokensPlus(t,
		`{"name":"worker-b","sha256":"`+HashToken(workerBToken)+`","scopes":["write"],"holders":{"names":["worker-b"]}}`)})
	admin := []string{"Authorization", "Bearer " + adminToken}
	workerB := []string{"Authorization", "Bearer " + workerBToken}

	t.Run("5.1 Parallel Start: concurrent identical intents return the SAME session and only 1 tuner lease is acquired", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-a", tuners: 2}
		const parallel = 8
		results := make([]startResult, parallel)
		var wg sync.WaitGroup
		for i := range parallel {
			wg.Go(func() { results[i] = g.handleStart("1:0:19:283D:3FB:1:C00000:0:0:0", "hd", "0", 0) })
		}
		wg.Wait()
		created := 0
		for i, r := range results {
			if r.outcome != "running" {
				t.Fatalf("intent %d: %s %+v", i, r.outcome, r.busy)
			}
			if r.status == 201 {
				created++
			}
			if r.dedup.LeaseID != results[0].dedup.LeaseID || r.tuner.LeaseID != results[0].tuner.LeaseID {
				t.Fatalf("intent %d got session %s / tuner %s, intent 0 %s / %s",
					i, r.dedup.LeaseID, r.tuner.LeaseID, results[0].dedup.LeaseID, results[0].tuner.LeaseID)
			}
			// A replay returns the same token, so any of the racing
			// requests can go on to renew and release.
			if r.dedup.Token == "" || r.dedup.Token != results[0].dedup.Token {
				t.Fatalf("intent %d: dedup token differs from intent 0's", i)
			}
		}
		if created != 1 {
			t.Fatalf("%d of %d identical intents created a lease, want exactly 1 (the others replay with 200)", created, parallel)
		}
		if tuners := g.activeTuners(); len(tuners) != 1 || tuners[0].LeaseID != results[0].tuner.LeaseID {
			t.Fatalf("active tuner leases = %d, want 1", len(tuners))
		}
		// Atomic idempotency: the event history holds one acquisition for
		// the service, not one per request.
		if n := countAcquired(t, e, "lease:service:1:0:19:283D:3FB:1:C00000:0:0:0"); n != 1 {
			t.Fatalf("acquired events for the service = %d, want 1", n)
		}
		releaseAll(t, e, results[0])
	})

	t.Run("5.2 Lease Busy: the same service with different params is refused busy (R_LEASE_BUSY); session A keeps running", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-a", tuners: 2}
		a := g.handleStart("svc-x", "hd", "0", 0)
		if a.outcome != "running" || a.status != 201 {
			t.Fatalf("session A: %s %d", a.outcome, a.status)
		}
		b := g.handleStart("svc-x", "sd", "0", 0) // different params -> different key
		if b.outcome != "R_LEASE_BUSY" || b.busy.Code != wire.CodeLeaseHeld {
			t.Fatalf("session B: %s %+v", b.outcome, b.busy)
		}
		// The refusal names who runs the service (never their token).
		if len(b.busy.Holders) != 1 || b.busy.Holders[0].LeaseID != a.dedup.LeaseID || b.busy.Holders[0].Holder != "worker-a" {
			t.Fatalf("LEASE_HELD holders = %+v", b.busy.Holders)
		}
		got := e.lease(200, "GET", "/v1/leases/"+a.dedup.LeaseID, "", "Authorization", "Bearer "+readToken)
		if got.State != "active" {
			t.Fatalf("session A after B's refusal: %s", got.State)
		}
		if tuners := g.activeTuners(); len(tuners) != 1 {
			t.Fatalf("B took a tuner: %d active", len(tuners))
		}
		releaseAll(t, e, a)
	})

	t.Run("3.2 Dedup lease busy, and I am the owner (re-entrant): continue and refresh", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-a", tuners: 2}
		a := g.handleStart("svc-re", "hd", "0", 0)
		// The worker handles the same intent again (a redelivered intent
		// event, or the worker itself after a restart, remembering nothing):
		// the idempotency key finds its own leases, with their tokens.
		again := g.handleStart("svc-re", "hd", "0", 0)
		if again.outcome != "running" || again.status != 200 ||
			again.dedup.LeaseID != a.dedup.LeaseID || again.dedup.Token != a.dedup.Token || again.tuner.LeaseID != a.tuner.LeaseID {
			t.Fatalf("re-entrant start: %s %d %s/%s, first %s/%s", again.outcome, again.status,
				again.dedup.LeaseID, again.tuner.LeaseID, a.dedup.LeaseID, a.tuner.LeaseID)
		}
		// Refresh: renew with the recovered token.
		for _, l := range []wire.Lease{again.dedup, again.tuner} {
			got := e.lease(200, "POST", "/v1/leases/"+l.LeaseID+"/renew", "", "Authorization", "Bearer "+writeToken, "X-Lease-Token", l.Token)
			if got.RenewalCount != 1 {
				t.Fatalf("refresh of %s: renewal_count %d", l.LeaseID, got.RenewalCount)
			}
		}
		// Another worker with the same intent is not the owner: busy.
		if b := (&gateway{e: e, holder: "worker-z", tuners: 2}).handleStart("svc-re", "hd", "0", 0); b.outcome != "R_LEASE_BUSY" {
			t.Fatalf("another worker, same intent: %s", b.outcome)
		}
		releaseAll(t, e, a)
	})

	t.Run("N tuner slots admit exactly N; the others are REJECTED_NO_TUNER and release their dedup lease", func(t *testing.T) {
		const slots, services = 3, 7
		g := &gateway{e: e, holder: "worker-a", tuners: slots}
		results := make([]startResult, services)
		var wg sync.WaitGroup
		for i := range services {
			wg.Go(func() { results[i] = g.handleStart(fmt.Sprintf("svc-%d", i), "hd", "0", 0) })
		}
		wg.Wait()
		running, rejected := 0, 0
		for i, r := range results {
			switch r.outcome {
			case "running":
				running++
			case "REJECTED_NO_TUNER":
				rejected++
				if r.busy.Code != wire.CodeLeaseHeld || len(r.busy.Holders) != slots {
					t.Fatalf("service %d: %+v", i, r.busy)
				}
				l := e.lease(200, "GET", "/v1/leases/"+r.dedup.LeaseID, "", "Authorization", "Bearer "+readToken)
				if l.State != "released" || l.EndReason != "no_tuner" {
					t.Fatalf("service %d's dedup lease after rejection: %s %q", i, l.State, l.EndReason)
				}
			default:
				t.Fatalf("service %d: %s %+v", i, r.outcome, r.busy)
			}
		}
		if running != slots || rejected != services-slots {
			t.Fatalf("running %d, rejected %d; want %d and %d", running, rejected, slots, services-slots)
		}
		if n := len(g.activeTuners()); n != slots {
			t.Fatalf("active tuner leases = %d, want %d", n, slots)
		}
		for _, r := range results {
			if r.outcome == "running" {
				releaseAll(t, e, r)
			}
		}
	})

	t.Run("5.3 Test A: kill without restart: the lease persists until its TTL, new attempts are busy until then", func(t *testing.T) {
		// The crashed worker's lease has a 3 s TTL (time for the busy
		// attempt below on a loaded machine) and is never renewed.
		sent := time.Now()
		crashed := e.lease(201, "POST", "/v1/leases", `{"key":"lease:service:svc-crash","holder":"worker-c","ttl_ms":3000}`,
			"Authorization", "Bearer "+writeToken)
		g := &gateway{e: e, holder: "worker-d", tuners: 2}
		if r := g.handleStart("svc-crash", "hd", "0", 0); r.outcome != "R_LEASE_BUSY" {
			t.Fatalf("while the crashed worker's lease lives: %s", r.outcome)
		}
		pollUntil(t, 10*time.Second, "the crashed worker's lease to expire", func() bool {
			l := e.lease(200, "GET", "/v1/leases/"+crashed.LeaseID, "", "Authorization", "Bearer "+readToken)
			return l.State == "expired"
		})
		if d := time.Since(sent); d < 3*time.Second {
			t.Fatalf("expired %v after the acquire was sent, TTL 3s", d)
		}
		r := g.handleStart("svc-crash", "hd", "0", 0)
		if r.outcome != "running" {
			t.Fatalf("after expiry: %s %+v", r.outcome, r.busy)
		}
		releaseAll(t, e, r)
	})

	t.Run("5.3 Test B: kill with restart: OnStartup frees the previous incarnation's leases at once (no TTL wait, no lock-delay)", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-b", tuners: 1}
		// Leases with a long TTL and a lock-delay: an expiry would keep the
		// slots blocked for 10 s more.
		first := g.handleStart("svc-restart", "hd", "0", 10000)
		if first.outcome != "running" {
			t.Fatalf("first incarnation: %s", first.outcome)
		}
		// The first incarnation also had a session and an acquire queued
		// for the tuner (wait_ms) when it died.
		sess := e.session(201, "POST", "/v1/sessions", `{"holder":"worker-b","ttl_ms":30000}`, "Authorization", "Bearer "+writeToken)
		queued := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			queued <- do(t, e.h, "POST", "/v1/leases", `{"key":"lease:tuner","holder":"worker-b","ttl_ms":30000,"wait_ms":30000}`,
				"Authorization", "Bearer "+writeToken)
		}()
		pollUntil(t, 10*time.Second, "the old incarnation's acquire to queue", func() bool {
			rec := e.call("POST", "/v1/leases", `{"key":"lease:tuner","holder":"probe","ttl_ms":30000}`, "Authorization", "Bearer "+writeToken)
			return rec.Code == 409 && strings.Contains(rec.Body.String(), "queued")
		})
		// kill -9; the restarted worker (same holder name) cannot use its
		// old tokens, and its new intents are busy until it flushes.
		if r := g.handleStart("svc-restart", "sd", "0", 0); r.outcome != "R_LEASE_BUSY" {
			t.Fatalf("before the flush: %s", r.outcome)
		}
		// The worker's own token may release its own holder only.
		wantError(t, e.call("POST", "/v1/holders/worker-e/release", "", workerB...), 403, wire.CodePermissionDenied, "")
		rec := e.call("POST", "/v1/holders/worker-b/release", `{"reason":"worker restarted"}`, workerB...)
		if rec.Code != 200 {
			t.Fatalf("release by holder: %d %s", rec.Code, rec.Body)
		}
		var ans holderReleaseAnswer
		jsonOf(t, rec, &ans)
		if ans.Released != 4 {
			t.Fatalf("released %d, want 4 (dedup and tuner leases, the session, the queued acquire)", ans.Released)
		}
		for _, id := range []string{first.dedup.LeaseID, first.tuner.LeaseID} {
			l := e.lease(200, "GET", "/v1/leases/"+id, "", "Authorization", "Bearer "+readToken)
			if l.State != "revoked" || l.EndReason != "worker restarted" {
				t.Fatalf("lease %s after the flush: %s %q", id, l.State, l.EndReason)
			}
		}
		if s := e.session(200, "GET", "/v1/sessions/"+sess.SessionID, "", admin...); s.State != "ended" || s.EndReason != "worker restarted" {
			t.Fatalf("the old incarnation's session after the flush: %s %q", s.State, s.EndReason)
		}
		// The zombie's queued acquire is withdrawn, not granted the freed
		// tuner.
		select {
		case rec := <-queued:
			wantError(t, rec, 409, wire.CodeLeaseRevoked, "")
		case <-time.After(10 * time.Second):
			t.Fatal("the queued acquire of the old incarnation is still waiting")
		}
		// Immediate availability: the very next intent runs, on the same
		// service and the only tuner slot.
		r := g.handleStart("svc-restart", "sd", "0", 0)
		if r.outcome != "running" {
			t.Fatalf("after the flush: %s %+v", r.outcome, r.busy)
		}
		if r.dedup.FencingToken <= first.dedup.FencingToken || r.tuner.FencingToken <= first.tuner.FencingToken {
			t.Fatal("fencing tokens did not increase across incarnations")
		}
		releaseAll(t, e, r)
		// Another worker's leases are untouched by worker-b's flush.
		other := (&gateway{e: e, holder: "worker-e", tuners: 1}).handleStart("svc-other", "hd", "0", 0)
		if other.outcome != "running" {
			t.Fatalf("worker-e: %s %+v", other.outcome, other.busy)
		}
		rec = e.call("POST", "/v1/holders/worker-b/release", "", workerB...)
		if rec.Code != 200 {
			t.Fatalf("second flush: %d", rec.Code)
		}
		if l := e.lease(200, "GET", "/v1/leases/"+other.dedup.LeaseID, "", admin...); l.State != "active" {
			t.Fatalf("worker-e's lease after worker-b's flush: %s", l.State)
		}
		releaseAll(t, e, other)
	})

	t.Run("6 Auth Strictness: reject paths (401/403) have no side effects", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-f", tuners: 4}
		held := g.handleStart("svc-auth", "hd", "0", 0)
		before := stateOf(t, e)
		m0 := e.metrics()
		idem := intentKey("svc-auth-2", "hd", "0")
		acquire := fmt.Sprintf(`{"key":"lease:service:svc-auth-2","holder":"worker-f","ttl_ms":30000,"idempotency_key":%q}`, idem)
		rejects := []struct {
			method, target, body string
			hdr                  []string
			status               int
		}{
			{"POST", "/v1/leases", acquire, nil, 401},
			{"POST", "/v1/leases", acquire, []string{"Authorization", "Bearer not-a-token"}, 401},
			{"POST", "/v1/leases", acquire, []string{"Authorization", "Bearer " + readToken}, 403},
			{"POST", "/v1/leases/" + held.dedup.LeaseID + "/renew", "", []string{"X-Lease-Token", held.dedup.Token}, 401},
			{"DELETE", "/v1/leases/" + held.dedup.LeaseID, "", []string{"X-Lease-Token", held.dedup.Token, "Authorization", "Bearer " + readToken}, 403},
			{"POST", "/v1/leases/" + held.tuner.LeaseID + "/revoke", `{"reason":"x"}`, []string{"Authorization", "Bearer " + writeToken}, 403},
			{"POST", "/v1/holders/worker-f/release", "", []string{"Authorization", "Bearer " + writeToken}, 403},
			{"POST", "/v1/holders/worker-f/release", "", nil, 401},
			{"POST", "/v1/heartbeat", fmt.Sprintf(`{"leases":[{"lease_id":%q,"token":%q}]}`, held.dedup.LeaseID, held.dedup.Token), []string{"Authorization", "Bearer " + readToken}, 403},
		}
		for _, r := range rejects {
			rec := e.call(r.method, r.target, r.body, r.hdr...)
			if rec.Code != r.status {
				t.Fatalf("%s %s %v: %d, want %d: %s", r.method, r.target, r.hdr, rec.Code, r.status, rec.Body)
			}
			if strings.Contains(rec.Body.String(), held.dedup.Token) {
				t.Fatalf("a rejection echoes a lease token")
			}
		}
		if after := stateOf(t, e); after != before {
			t.Fatalf("rejected requests changed the state:\n%s\n%s", before, after)
		}
		m1 := e.metrics()
		for _, name := range []string{"leasehold_leases_acquired_total", "leasehold_leases_renewed_total",
			"leasehold_leases_released_total", "leasehold_leases_revoked_total", "leasehold_active_leases"} {
			if m1[name] != m0[name] {
				t.Errorf("%s went from %v to %v across rejected requests", name, m0[name], m1[name])
			}
		}
		// The rejected intent did not reserve its idempotency key: the
		// authorized one with other parameters under the same key is a
		// new lease, not IDEMPOTENCY_CONFLICT.
		ok := fmt.Sprintf(`{"key":"lease:service:svc-auth-2","holder":"worker-f","ttl_ms":20000,"idempotency_key":%q}`, idem)
		l := e.lease(201, "POST", "/v1/leases", ok, "Authorization", "Bearer "+writeToken)
		if l.TTLMS != 20000 {
			t.Fatalf("authorized acquire: %+v", l)
		}
		releaseAll(t, e, held)
	})
}

// countAcquired counts the acquired events of key in the event history.
func countAcquired(t *testing.T, e *useCaseEnv, key string) int {
	t.Helper()
	n := 0
	for _, ev := range history(t, e, "key="+key) {
		if ev.Type == "acquired" {
			n++
		}
	}
	return n
}

// history reads the event history matching query (after "/v1/events?")
// up to the events of the current index.
func history(t *testing.T, e *useCaseEnv, query string) []wire.Event {
	t.Helper()
	rec := e.call("GET", "/v1/leases?limit=1", "", "Authorization", "Bearer "+adminToken)
	var upTo uint64
	if _, err := fmt.Sscan(rec.Header().Get(headerIndex), &upTo); err != nil {
		t.Fatalf("index header: %v", err)
	}
	resp, cancel := openStream(t, e.srv, "/v1/events?from=start&"+query, "Authorization", "Bearer "+adminToken)
	defer cancel()
	if resp.StatusCode != 200 {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	return readEventsUntil(t, resp.Body, upTo)
}

// readEventsUntil reads events from an open stream until one of an index
// at or above upTo has been read or the stream goes quiet for 1 s after
// the last event (the rest of the history does not match the filter).
func readEventsUntil(t *testing.T, resp interface{ Read([]byte) (int, error) }, upTo uint64) []wire.Event {
	t.Helper()
	evs := make(chan wire.Event)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(evs)
		dec := newSSEDecoder(resp)
		for {
			ev, ok := dec.next()
			if !ok {
				return
			}
			select {
			case evs <- ev:
			case <-done:
				return
			}
		}
	}()
	var out []wire.Event
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return out
			}
			out = append(out, ev)
			if ev.Index >= upTo {
				return out
			}
		case <-time.After(time.Second):
			return out
		}
	}
}

// stateOf renders every retained lease (id, state, renewals, end reason),
// which the rejected requests of a test must leave alone; query (after
// "/v1/leases?") narrows it.
func stateOf(t *testing.T, e *useCaseEnv, query ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range e.list(strings.Join(append([]string{"limit=1000"}, query...), "&"), "Authorization", "Bearer "+adminToken) {
		fmt.Fprintf(&b, "%s %s %s %d %s\n", l.LeaseID, l.Key, l.State, l.RenewalCount, l.EndReason)
	}
	return b.String()
}

// releaseAll releases what a started intent holds.
func releaseAll(t *testing.T, e *useCaseEnv, r startResult) {
	t.Helper()
	for _, l := range []wire.Lease{r.dedup, r.tuner} {
		if l.LeaseID == "" {
			continue
		}
		rec := e.call("DELETE", "/v1/leases/"+l.LeaseID, "", "Authorization", "Bearer "+writeToken, "X-Lease-Token", l.Token)
		if rec.Code != 200 {
			t.Fatalf("release %s: %d %s", l.LeaseID, rec.Code, rec.Body)
		}
	}
}

// sseDecoder reads the events of a stream, skipping comments.
type sseDecoder struct {
	data []byte
	r    interface{ Read([]byte) (int, error) }
	buf  []byte
}

func newSSEDecoder(r interface{ Read([]byte) (int, error) }) *sseDecoder {
	return &sseDecoder{r: r, buf: make([]byte, 4096)}
}

// next returns the next event, false at the end of the stream.
func (d *sseDecoder) next() (wire.Event, bool) {
	for {
		if i := strings.Index(string(d.data), "\n\n"); i >= 0 {
			msg := string(d.data[:i])
			d.data = d.data[i+2:]
			for _, line := range strings.Split(msg, "\n") {
				if v, ok := strings.CutPrefix(line, "data: "); ok {
					var ev wire.Event
					if err := json.Unmarshal([]byte(v), &ev); err == nil {
						return ev, true
					}
				}
			}
			continue
		}
		n, err := d.r.Read(d.buf)
		d.data = append(d.data, d.buf[:n]...)
		if err != nil && n == 0 {
			return wire.Event{}, false
		}
	}
}
