package api

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// The work-item lease registrar (docs/use-cases.md): at most
// one agent owns a work item; leases go ACTIVE -> RELEASED / EXPIRED and
// never back; only the holder releases; expiry is tick-based; terminal
// leases are pruned; inputs are size-limited. fsm/registrar_test.go shows each
// invariant on the state machine with the wall clock under the test's
// control; this test shows them through the HTTP API of a real node, where
// an agent is a holder, a work item a key, and the registrar Leasehold.

func TestUseCaseRegistrar(t *testing.T) {
	const retention = 1500 * time.Millisecond
	e := newUseCaseEnv(t, Options{Tokens: testTokens(t)}, func(c *node.Config) { c.Retention = retention })
	agent := []string{"Authorization", "Bearer " + writeToken} // an agent: read and write scopes
	admin := []string{"Authorization", "Bearer " + adminToken}
	issue := func(work, actor string, ttlMS int) wire.Lease {
		t.Helper()
		return e.lease(201, "POST", "/v1/leases", fmt.Sprintf(`{"key":%q,"holder":%q,"ttl_ms":%d}`, work, actor, ttlMS), agent...)
	}
	with := func(hdr []string, more ...string) []string { return append(append([]string{}, hdr...), more...) }

	t.Run("INV-0101 state transitions are irreversible: Active -> {Released, Expired} with no cycles", func(t *testing.T) {
		rel := issue("work-001", "agent-001", 60000)
		e.lease(200, "DELETE", "/v1/leases/"+rel.LeaseID+"?reason=COMPLETED", "", with(agent, "X-Lease-Token", rel.Token)...)
		exp := issue("work-002", "agent-001", 200)
		pollUntil(t, 10*time.Second, "work-002's lease to expire", func() bool {
			return e.lease(200, "GET", "/v1/leases/"+exp.LeaseID, "", agent...).State == "expired"
		})
		for _, c := range []struct {
			l     wire.Lease
			state string
			code  wire.Code
		}{{rel, "released", wire.CodeLeaseReleased}, {exp, "expired", wire.CodeLeaseExpired}} {
			tok := with(agent, "X-Lease-Token", c.l.Token)
			wantError(t, e.call("POST", "/v1/leases/"+c.l.LeaseID+"/renew", "", tok...), 409, c.code, "")
			wantError(t, e.call("DELETE", "/v1/leases/"+c.l.LeaseID, "", tok...), 409, c.code, "")
			wantError(t, e.call("POST", "/v1/leases/"+c.l.LeaseID+"/revoke", `{"reason":"x"}`, admin...), 409, c.code, "")
			got := e.lease(200, "GET", "/v1/leases/"+c.l.LeaseID, "", agent...)
			if got.State != c.state || got.RenewalCount != 0 {
				t.Fatalf("%s after operations on it: %+v", c.state, got)
			}
		}
		// CTR-0202: the release reason is recorded for audit.
		if got := e.lease(200, "GET", "/v1/leases/"+rel.LeaseID, "", agent...); got.EndReason != "COMPLETED" || got.EndedAt == nil {
			t.Fatalf("released lease's audit fields: %+v", got)
		}
	})

	t.Run("INV-0402 at most one active lease per work_id; CTR-0501 the refusal names the existing lease", func(t *testing.T) {
		first := issue("work-100", "agent-001", 60000)
		for _, actor := range []string{"agent-002", "agent-001"} {
			rec := e.call("POST", "/v1/leases", fmt.Sprintf(`{"key":"work-100","holder":%q,"ttl_ms":60000}`, actor), agent...)
			busy := wantError(t, rec, 409, wire.CodeLeaseHeld, "")
			if len(busy.Holders) != 1 || busy.Holders[0].LeaseID != first.LeaseID || busy.Key != "work-100" {
				t.Fatalf("LEASE_HELD = %+v", busy)
			}
		}
		// CTR-0401 get_active_lease_for_work, has_active_lease.
		act := e.list("key=work-100&state=active", agent...)
		if len(act) != 1 || act[0].LeaseID != first.LeaseID {
			t.Fatalf("active leases of work-100 = %d", len(act))
		}
		e.lease(200, "DELETE", "/v1/leases/"+first.LeaseID, "", with(agent, "X-Lease-Token", first.Token)...)
		if act := e.list("key=work-100&state=active", agent...); len(act) != 0 {
			t.Fatalf("work-100 still has an active lease after release")
		}
		second := issue("work-100", "agent-002", 60000)
		if second.FencingToken <= first.FencingToken {
			t.Fatalf("fencing token %d after %d", second.FencingToken, first.FencingToken)
		}
		// leases_by_actor
		if mine := e.list("holder=agent-002&state=active", agent...); len(mine) != 1 || mine[0].LeaseID != second.LeaseID {
			t.Fatalf("active leases of agent-002 = %v", mine)
		}
	})

	t.Run("INV-0301 lease_id is unique; duplicates are rejected: the registrar assigns ids, a client cannot name one", func(t *testing.T) {
		rec := e.call("POST", "/v1/leases", `{"lease_id":"lease-001","key":"work-200","holder":"agent-001","ttl_ms":60000}`, agent...)
		wantError(t, rec, 400, wire.CodeInvalidArgument, "lease_id")
		seen := map[string]bool{}
		for i := range 50 {
			l := issue(fmt.Sprintf("work-2%02d", i), "agent-001", 60000)
			if seen[l.LeaseID] || !strings.HasPrefix(l.LeaseID, "ls_") {
				t.Fatalf("lease id %q repeated or malformed", l.LeaseID)
			}
			seen[l.LeaseID] = true
		}
	})

	t.Run("INV-0302 zero or negative duration rejected at issuance", func(t *testing.T) {
		for _, ttl := range []string{"0", "-1000", "50"} {
			rec := e.call("POST", "/v1/leases", `{"key":"work-300","holder":"agent-001","ttl_ms":`+ttl+`}`, agent...)
			wantError(t, rec, 400, wire.CodeInvalidArgument, "ttl_ms")
		}
		if got := e.list("key=work-300", agent...); len(got) != 0 {
			t.Fatalf("a rejected issuance left %d leases", len(got))
		}
	})

	t.Run("INV-0303 renewal_count counts renewals (saturating at 2^32-1: shown on the state machine)", func(t *testing.T) {
		l := issue("work-400", "agent-001", 60000)
		for i := 1; i <= 3; i++ {
			got := e.lease(200, "POST", "/v1/leases/"+l.LeaseID+"/renew", "", with(agent, "X-Lease-Token", l.Token)...)
			if got.RenewalCount != uint32(i) || got.LastRenewedAt == nil {
				t.Fatalf("renewal %d: count %d", i, got.RenewalCount)
			}
		}
	})

	t.Run("INV-0305 tick-based expiry: remaining time is counted in committed ticks, never read off the wall clock", func(t *testing.T) {
		// remaining_ms is (expiry tick - current tick) x tick period: a
		// whole number of ticks whatever the wall clock says. expires_at is
		// only now + remaining_ms, for display (CTR-0304/0305 deprecated
		// wall-time methods have no counterpart in the API).
		l := issue("work-500", "agent-001", 60000)
		for range 5 {
			got := e.lease(200, "GET", "/v1/leases/"+l.LeaseID, "", agent...)
			if got.RemainingMS%useCaseTick.Milliseconds() != 0 || got.RemainingMS > 60000 {
				t.Fatalf("remaining_ms %d is not a whole number of %v ticks", got.RemainingMS, useCaseTick)
			}
		}
	})

	t.Run("Early Expiration Attack: no request ends another agent's lease early", func(t *testing.T) {
		victim := issue("work-600", "agent-001", 60000)
		tok := with(agent, "X-Lease-Token", victim.Token)
		// A renewal asking for a shorter TTL does not bring the end forward.
		short := e.lease(200, "POST", "/v1/leases/"+victim.LeaseID+"/renew", `{"ttl_ms":1000}`, tok...)
		if short.RemainingMS < 50000 {
			t.Fatalf("a short renewal shortened the lease: remaining %d ms", short.RemainingMS)
		}
		// Expiry is not a request: revoking (the operator's force release)
		// needs the admin scope; the client-facing release needs the token.
		wantError(t, e.call("POST", "/v1/leases/"+victim.LeaseID+"/revoke", `{"reason":"expired"}`, agent...), 403, wire.CodePermissionDenied, "")
		if got := e.lease(200, "GET", "/v1/leases/"+victim.LeaseID, "", agent...); got.State != "active" {
			t.Fatalf("victim after the attack: %s", got.State)
		}
	})

	t.Run("CTR-0505 Unauthorized Release Attack: only the holder may release", func(t *testing.T) {
		victim := issue("work-700", "agent-001", 60000)
		thief := issue("work-701", "agent-002", 60000)
		before := stateOf(t, e, "state=active")
		for _, hdr := range [][]string{
			with(agent, "X-Lease-Token", thief.Token),    // another agent's lease token
			with(agent, "X-Lease-Token", "forged-token"), // a guess
			agent, // no token at all
		} {
			rec := e.call("DELETE", "/v1/leases/"+victim.LeaseID+"?reason=VOLUNTARY", "", hdr...)
			if rec.Code != 403 && rec.Code != 400 {
				t.Fatalf("release without the holder's token: %d %s", rec.Code, rec.Body)
			}
		}
		// Releasing everything of agent-001 is an operator action.
		wantError(t, e.call("POST", "/v1/holders/agent-001/release", "", agent...), 403, wire.CodePermissionDenied, "")
		if after := stateOf(t, e, "state=active"); after != before {
			t.Fatalf("unauthorized releases changed the state:\n%s\n%s", before, after)
		}
	})

	t.Run("INV-0304 Pruning Evasion and CTR-0402 pruning: terminal leases are pruned a retention after they ended, active ones never", func(t *testing.T) {
		keep := issue("work-800", "agent-001", 60000)
		done := issue("work-801", "agent-001", 60000)
		exp := issue("work-802", "agent-001", 200)
		e.lease(200, "DELETE", "/v1/leases/"+done.LeaseID, "", with(agent, "X-Lease-Token", done.Token)...)
		ended := time.Now()
		// Readable (terminal) for the retention, counted from the end the
		// registrar recorded; then 404.
		if got := e.lease(200, "GET", "/v1/leases/"+done.LeaseID, "", agent...); got.State != "released" {
			t.Fatalf("just released: %s", got.State)
		}
		for _, l := range []wire.Lease{done, exp} {
			pollUntil(t, 15*time.Second, "lease "+l.Key+" to be pruned", func() bool {
				return e.call("GET", "/v1/leases/"+l.LeaseID, "", agent...).Code == 404
			})
		}
		if d := time.Since(ended); d < retention {
			t.Fatalf("a released lease was pruned %v after it ended, retention %v", d, retention)
		}
		wantError(t, e.call("GET", "/v1/leases/"+done.LeaseID, "", agent...), 404, wire.CodeLeaseNotFound, "")
		if got := e.lease(200, "GET", "/v1/leases/"+keep.LeaseID, "", agent...); got.State != "active" {
			t.Fatalf("an active lease was pruned or ended: %s", got.State)
		}
		// Pruning never lowers a fencing token.
		again := issue("work-801", "agent-003", 60000)
		if again.FencingToken <= done.FencingToken {
			t.Fatalf("fencing token %d after pruning, earlier %d", again.FencingToken, done.FencingToken)
		}
	})

	t.Run("Input validation: size limits are enforced and a refused input changes nothing", func(t *testing.T) {
		before := stateOf(t, e, "state=active")
		meta := make([]string, 17)
		for i := range meta {
			meta[i] = fmt.Sprintf(`"m%d":"v"`, i)
		}
		cases := []struct {
			body   string
			status int
			field  string
		}{
			{`{"key":"` + strings.Repeat("w", 513) + `","holder":"agent-001","ttl_ms":60000}`, 400, "key"},
			{`{"key":"work-900","holder":"` + strings.Repeat("a", 129) + `","ttl_ms":60000}`, 400, "holder"},
			{`{"key":"work-900","holder":"","ttl_ms":60000}`, 400, "holder"},
			{`{"key":"work-900","holder":"agent-001","ttl_ms":60000,"metadata":{` + strings.Join(meta, ",") + `}}`, 400, "metadata"},
			{`{"key":"work-900","holder":"agent-001","ttl_ms":60000,"idempotency_key":"` + strings.Repeat("i", 257) + `"}`, 400, "idempotency_key"},
			{`{"key":"work-900","holder":"agent-001","ttl_ms":60000,"metadata":{"sig":"` + strings.Repeat("s", 70000) + `"}}`, 413, ""},
		}
		for _, c := range cases {
			rec := e.call("POST", "/v1/leases", c.body, agent...)
			code := wire.CodeInvalidArgument
			if c.status == 413 {
				code = wire.CodePayloadTooLarge
			}
			wantError(t, rec, c.status, code, c.field)
		}
		if after := stateOf(t, e, "state=active"); after != before {
			t.Fatalf("refused inputs changed the state:\n%s\n%s", before, after)
		}
		if got := e.list("key=work-900", agent...); len(got) != 0 {
			t.Fatalf("refused inputs left %d leases", len(got))
		}
		// At the limits exactly, it is accepted; a reason over 256 bytes is not.
		l := e.lease(201, "POST", "/v1/leases", `{"key":"`+strings.Repeat("w", 512)+`","holder":"`+strings.Repeat("a", 128)+`","ttl_ms":60000}`, agent...)
		wantError(t, e.call("DELETE", "/v1/leases/"+l.LeaseID+"?reason="+strings.Repeat("r", 257), "", with(agent, "X-Lease-Token", l.Token)...), 400, wire.CodeInvalidArgument, "reason")
		if got := e.lease(200, "GET", "/v1/leases/"+l.LeaseID, "", agent...); got.State != "active" {
			t.Fatalf("a refused release ended the lease: %s", got.State)
		}
		e.lease(200, "DELETE", "/v1/leases/"+l.LeaseID, "", with(agent, "X-Lease-Token", l.Token)...)
	})
}
