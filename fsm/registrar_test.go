package fsm_test

import (
	"bytes"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// The work-item lease registrar (docs/use-cases.md) is an event-sourced
// reducer whose leases give one agent exclusive ownership of a
// work item. Leasehold's state machine is such a reducer: every change is a
// log entry applied in order, and a lease's "work_id" is its key. These
// subtests take each invariant, contract or attack the registrar names and show
// it on the state machine, where the test controls both clocks: the tick
// entries and the wall-clock milliseconds every command carries.

// wallTick advances the state machine by one tick whose entry carries the
// wall-clock reading wallMS (whatever the leader's wall clock said).
func (h *harness) wallTick(wallMS int64) {
	h.t.Helper()
	next := h.f.Tick() + 1
	h.one(&fsm.Tick{Tick: next, WallMS: wallMS, PeriodMS: periodMS, RetainTicks: h.retain})
	if h.f.Tick() != next {
		h.t.Fatalf("tick %d did not apply", next)
	}
}

// Wall-clock readings the tests throw at the state machine.
const (
	wall2026 = int64(1_780_000_000_000) // a sane reading
	wall2100 = int64(4_102_444_800_000) // the clock jumped 74 years forward
	wall1970 = int64(0)                 // the clock was reset
)

func TestRegistrarInvariants(t *testing.T) {
	t.Run("INV-0101 state transitions are irreversible: Active -> {Released, Expired} with no cycles", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		h.one(acq("R", "work-001", "agent-001", 5))
		if r := h.one(release("R")); r.Err != nil || r.Lease.State != fsm.StateReleased {
			t.Fatalf("release: %+v", r)
		}
		h.one(acq("E", "work-002", "agent-001", 2))
		h.tickTo(h.f.EndTick(h.f.Lease("E")) + fsm.GraceTicks)
		if l := h.f.Lease("E"); l.State != fsm.StateExpired {
			t.Fatalf("E not expired at its end: %+v", l)
		}
		// Every operation on a terminal lease fails and changes nothing
		// (INV-0102: is_terminal() leases reject operations).
		for _, c := range []struct {
			id   string
			want wire.Code
		}{{"R", wire.CodeLeaseReleased}, {"E", wire.CodeLeaseExpired}} {
			before := jsonOf(t, h.f.Lease(c.id))
			wantCode(t, c.id+" renew", h.one(renew(c.id)).Err, c.want)
			wantCode(t, c.id+" release", h.one(release(c.id)).Err, c.want)
			wantCode(t, c.id+" revoke", h.one(&fsm.Revoke{LeaseID: c.id, WallMS: wall2026}).Err, c.want)
			wantCode(t, c.id+" bulk heartbeat", h.one(&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: c.id, TokenHash: tok(c.id)}}}).Items[0].Err, c.want)
			h.tick(3)
			if after := jsonOf(t, h.f.Lease(c.id)); after != before {
				t.Fatalf("%s changed after operations on a terminal lease:\n%s\n%s", c.id, before, after)
			}
		}
		// A revoked lease (Leasehold's fourth state, an operator's force
		// release) is just as final.
		h.one(acq("V", "work-003", "agent-001", 5))
		h.one(&fsm.Revoke{LeaseID: "V", WallMS: wall2026})
		wantCode(t, "V renew", h.one(renew("V")).Err, wire.CodeLeaseRevoked)
		if l := h.f.Lease("V"); l.State != fsm.StateRevoked {
			t.Fatalf("V = %+v", l)
		}
	})

	t.Run("INV-0402 at most one active lease per work_id (CTR-0501 WorkAlreadyLeased names the existing lease)", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		h.one(acq("A", "work-001", "agent-001", 10))
		r := h.one(acq("B", "work-001", "agent-002", 10))
		wantCode(t, "second lease on the work item", r.Err, wire.CodeLeaseHeld)
		if len(r.Err.Holders) != 1 || r.Err.Holders[0].LeaseID != "A" || r.Err.Key != "work-001" {
			t.Fatalf("LEASE_HELD details = %+v", r.Err)
		}
		if h.f.Lease("B") != nil || len(h.f.ActiveOnKey("work-001")) != 1 {
			t.Fatal("the refused acquire left a record")
		}
		// Not even the same agent gets a second lease on it.
		wantCode(t, "same agent again", h.one(acq("A2", "work-001", "agent-001", 10)).Err, wire.CodeLeaseHeld)
		// CTR-0401: once released, the work item is free for a new lease.
		h.one(release("A"))
		if r := h.one(acq("B", "work-001", "agent-002", 10)); r.Err != nil {
			t.Fatalf("after release: %v", r.Err)
		}
		if act := h.f.ActiveOnKey("work-001"); len(act) != 1 || act[0].ID != "B" {
			t.Fatalf("active on work-001 = %v", act)
		}
	})

	t.Run("INV-0301 lease_id is unique across all leases; duplicates are rejected (CTR-0502)", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		h.one(acq("L1", "work-001", "agent-001", 10))
		r := h.one(acq("L1", "work-002", "agent-002", 10))
		if code(r.Err) != wire.CodeInvalidArgument || r.Err.Field != "lease_id" {
			t.Fatalf("duplicate id of an active lease: %v", r.Err)
		}
		h.one(release("L1"))
		r = h.one(acq("L1", "work-002", "agent-002", 10))
		if code(r.Err) != wire.CodeInvalidArgument || r.Err.Field != "lease_id" {
			t.Fatalf("duplicate id of a retained terminal lease: %v", r.Err)
		}
		if l := h.f.Lease("L1"); l.Key != "work-001" || l.State != fsm.StateReleased {
			t.Fatalf("the duplicate changed the original: %+v", l)
		}
	})

	t.Run("INV-0302 zero duration is rejected at issuance", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		a := acq("Z", "work-001", "agent-001", 0)
		a.TTLMS = 0
		r := h.one(a)
		if code(r.Err) != wire.CodeInvalidArgument || r.Err.Field != "ttl_ms" {
			t.Fatalf("zero ttl: %v", r.Err)
		}
		if h.f.Lease("Z") != nil {
			t.Fatal("a zero-duration lease was stored")
		}
	})

	t.Run("INV-0303 renewal_count uses saturating arithmetic; cannot overflow", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		h.one(acq("S", "work-001", "agent-001", 10))
		h.one(renew("S"))
		// Four billion renewals take too long to apply one by one: start
		// from a state where the count is one below the maximum (a format 1
		// snapshot is JSON, so the count can be set in it).
		snap := snapshotV1(t, h.f)
		old := []byte(`"renewal_count":1,`)
		if bytes.Count(snap, old) != 1 {
			t.Fatalf("snapshot has no single renewal_count 1:\n%s", snap)
		}
		f := restored(t, bytes.Replace(snap, old, []byte(`"renewal_count":4294967294,`), 1))
		h2 := &harness{t: t, f: f, index: h.index}
		for _, want := range []uint32{4294967295, 4294967295, 4294967295} {
			r := h2.one(renew("S"))
			if r.Err != nil || r.Lease.RenewalCount != want {
				t.Fatalf("renewal: %v, count %d, want %d", r.Err, r.Lease.RenewalCount, want)
			}
		}
		if l := h2.f.Lease("S"); l.State != fsm.StateActive || l.RenewalCount != 4294967295 {
			t.Fatalf("after saturation: %+v", l)
		}
	})

	t.Run("INV-0305 tick-based expiry is immune to wall-clock manipulation", func(t *testing.T) {
		// Two replicas apply the same operations; one leader's wall clock
		// is sane, the other's jumps 74 years forward, back to 1970 and
		// around. Expiry, remaining time and the expiry tick are identical:
		// the wall clock is only copied into display fields.
		sane, wild := newHarness(t), newHarness(t)
		wildWall := []int64{wall2100, wall1970, -1, wall2100 * 2, wall1970}
		for i, h := range []*harness{sane, wild} {
			h.wallTick(wall2026)
			a := acq("T", "work-001", "agent-001", 5)
			if i == 1 {
				a.WallMS = wall2100
			}
			h.one(a)
		}
		start := sane.f.Tick()
		end := sane.f.EndTick(sane.f.Lease("T")) + fsm.GraceTicks
		if end != start+5+fsm.GraceTicks {
			t.Fatalf("expiry tick %d, want %d", end, start+5+fsm.GraceTicks)
		}
		for k := 0; sane.f.Tick() < end; k++ {
			sane.wallTick(wall2026 + int64(k+1)*periodMS)
			wild.wallTick(wildWall[k%len(wildWall)])
			s, w := sane.f.Lease("T"), wild.f.Lease("T")
			if s.State != w.State || sane.f.EndTick(s) != wild.f.EndTick(w) {
				t.Fatalf("tick %d: sane %s (end %d), wild %s (end %d)", sane.f.Tick(), s.State, sane.f.EndTick(s), w.State, wild.f.EndTick(w))
			}
			wantState := fsm.StateActive
			if sane.f.Tick() >= end {
				wantState = fsm.StateExpired
			}
			if w.State != wantState {
				t.Fatalf("tick %d: state %s, want %s (expiry at tick %d)", wild.f.Tick(), w.State, wantState, end)
			}
		}
		if l := wild.f.Lease("T"); l.EndedTick() != end {
			t.Fatalf("ended at tick %d, want %d", l.EndedTick(), end)
		}
		// CTR-0301: expired iff the tick reached the end; nothing about the
		// wall clock decides it. The wall clock did reach the display field.
		if wild.f.WallMS() == sane.f.WallMS() {
			t.Fatal("the test's wall clocks did not differ")
		}
	})

	t.Run("INV-0305 the code path that decides expiry reads no clock: the state machine imports no time, randomness or I/O", func(t *testing.T) {
		// Expiry is decided only in this package, from tick entries. (The
		// leader's tick loop in package node paces ticks with Go's
		// monotonic clock, time.Until on a time.Now() reading, which a
		// wall-clock change does not move.)
		files, err := filepath.Glob("*.go")
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			if strings.HasPrefix(name, "canary_") && strings.HasSuffix(name, "_on.go") {
				continue // a deliberate bug behind its build tag, never in a normal build
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				switch path {
				case "time", "math/rand", "math/rand/v2", "crypto/rand", "os", "net", "syscall":
					t.Errorf("%s imports %s", name, path)
				}
			}
			checked++
		}
		if checked < 5 {
			t.Fatalf("checked only %d files", checked)
		}
	})

	t.Run("Early Expiration Attack: rejected; nothing but the next tick moves time", func(t *testing.T) {
		// APM2 rejects a LeaseExpired event whose expired_at is before the
		// lease's expires_at. Leasehold has no "expire this lease" command
		// at all: expiry is decided by the state machine when a tick
		// reaches the end. The only time input is the Tick entry, and a
		// tick that is not exactly one past the current one is ignored.
		h := newHarness(t)
		h.tick(1)
		h.one(acq("X", "work-001", "agent-001", 10))
		at := h.f.Tick()
		for _, jump := range []uint64{at + 1000, at + 12, at, 0} {
			h.one(&fsm.Tick{Tick: jump, WallMS: wall2100, PeriodMS: periodMS})
			if h.f.Tick() != at {
				t.Fatalf("a tick entry for %d moved the clock from %d to %d", jump, at, h.f.Tick())
			}
		}
		if l := h.f.Lease("X"); l.State != fsm.StateActive || h.f.EndTick(l) != at+10 {
			t.Fatalf("after forged ticks: %+v end %d", l, h.f.EndTick(l))
		}
		// A renewal with a shorter TTL cannot bring the end forward either
		// (APM2's RenewalDoesNotExtend): the later end is kept.
		r := h.one(&fsm.Renew{LeaseID: "X", TokenHash: tok("X"), TTLMS: periodMS, TTLTicks: 1, WallMS: wall2100})
		if r.Err != nil || h.f.EndTick(r.Lease) != at+10 {
			t.Fatalf("short renewal: %v end %d, want %d", r.Err, h.f.EndTick(r.Lease), at+10)
		}
		h.tickTo(at + 10 + fsm.GraceTicks - 1)
		if h.f.Lease("X").State != fsm.StateActive {
			t.Fatal("expired before its TTL plus grace")
		}
		h.tick(1)
		if h.f.Lease("X").State != fsm.StateExpired {
			t.Fatal("not expired at its TTL plus grace")
		}
	})

	t.Run("CTR-0505 Unauthorized Release Attack: only the holder may release", func(t *testing.T) {
		h := newHarness(t)
		h.tick(1)
		h.one(acq("U", "work-001", "agent-001", 10))
		before := jsonOf(t, h.f.Lease("U"))
		wantCode(t, "release with another's token", h.one(&fsm.Release{LeaseID: "U", TokenHash: badTok, WallMS: 1}).Err, wire.CodeLeaseTokenInvalid)
		wantCode(t, "release without a token", h.one(&fsm.Release{LeaseID: "U", WallMS: 1}).Err, wire.CodeLeaseTokenInvalid)
		wantCode(t, "renew with another's token", h.one(&fsm.Renew{LeaseID: "U", TokenHash: badTok, WallMS: 1}).Err, wire.CodeLeaseTokenInvalid)
		// Another agent releasing "everything of agent-002" touches nothing
		// of agent-001.
		if r := h.one(&fsm.ReleaseHolder{Holder: "agent-002", WallMS: 1}); r.Err != nil || r.Count != 0 {
			t.Fatalf("release holder agent-002: %+v", r)
		}
		if after := jsonOf(t, h.f.Lease("U")); after != before {
			t.Fatalf("the lease changed:\n%s\n%s", before, after)
		}
	})

	t.Run("INV-0304 Pruning Evasion Attack: terminated_at comes from the state machine, not the request", func(t *testing.T) {
		// A released lease's end is the tick its release applied at and an
		// expired lease's is its expiry tick, whatever wall clock the entry
		// carried. Retention counts from that tick, so a request claiming
		// 1970 is not pruned early and one claiming 2100 does not linger.
		const retain = 20
		h := newHarness(t)
		h.retain = retain
		h.tick(1)
		for _, id := range []string{"Old", "Future", "Honest"} {
			h.one(acq(id, "work-"+id, "agent-001", 50))
		}
		h.one(acq("Exp", "work-exp", "agent-001", 3))
		h.tick(1)
		for id, wall := range map[string]int64{"Old": wall1970, "Future": wall2100, "Honest": wall2026} {
			h.one(&fsm.Release{LeaseID: id, TokenHash: tok(id), WallMS: wall})
		}
		released := h.f.Tick()
		expired := h.f.EndTick(h.f.Lease("Exp")) + fsm.GraceTicks
		for h.f.Tick() < expired+retain+1 {
			h.tick(1)
			now := h.f.Tick()
			for _, id := range []string{"Old", "Future", "Honest", "Exp"} {
				end := released
				if id == "Exp" {
					end = expired
				}
				l := h.f.Lease(id)
				switch {
				case now < end:
				case now < end+retain:
					if l == nil || l.EndedTick() != end {
						t.Fatalf("tick %d: %s pruned early or ended at the wrong tick: %+v (end %d)", now, id, l, end)
					}
				default:
					if l != nil {
						t.Fatalf("tick %d: %s not pruned %d ticks after its end %d", now, id, retain, end)
					}
				}
			}
		}
	})

	t.Run("CTR-0402 pruning removes only terminal leases; active leases and fencing untouched", func(t *testing.T) {
		const retain = 5
		h := newHarness(t)
		h.retain = retain
		h.tick(1)
		h.one(acq("Keep", "work-001", "agent-001", 4))
		h.one(acq("Done", "work-002", "agent-002", 4))
		fence := h.one(acq("Gone", "work-003", "agent-003", 4)).Lease.Fence
		h.one(release("Done"))
		h.one(release("Gone"))
		for range 4 * retain {
			h.tick(1)
			if r := h.one(renew("Keep")); r.Err != nil {
				t.Fatalf("renew: %v", r.Err)
			}
		}
		if h.f.Lease("Done") != nil || h.f.Lease("Gone") != nil {
			t.Fatal("terminal leases were not pruned")
		}
		if l := h.f.Lease("Keep"); l == nil || l.State != fsm.StateActive {
			t.Fatalf("an active lease was pruned or ended: %+v", l)
		}
		// Pruning never lowers a fencing token: the next lease on the
		// pruned work item gets a higher one.
		if r := h.one(acq("Again", "work-003", "agent-004", 4)); r.Err != nil || r.Lease.Fence <= fence {
			t.Fatalf("after pruning: %v fence %d, earlier %d", r.Err, r.Lease.Fence, fence)
		}
	})

	t.Run("INV-0502 apply() is deterministic; same event sequence produces identical state", func(t *testing.T) {
		run := func() []byte {
			h := newHarness(t)
			h.retain = 3
			h.wallTick(wall2026)
			h.one(acq("A", "work-001", "agent-001", 2))
			h.one(acq("B", "work-002", "agent-002", 6))
			h.one(renew("B"))
			h.one(release("B"))
			h.tick(6)
			return snapshotBytes(t, h.f)
		}
		if a, b := run(), run(); !bytes.Equal(a, b) {
			t.Fatal("the same log gave different snapshots")
		}
	})
}
