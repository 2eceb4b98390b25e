package fsm_test

import (
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func TestApply(t *testing.T) {
	tests := []struct {
		name   string
		retain uint64
		steps  []step
	}{
		{name: "exclusive acquire and LEASE_HELD", steps: []step{
			doCheck(acq("L1", "k", "alice", 10), "", func(t *testing.T, h *harness, res []fsm.Result) {
				l := res[0].Lease
				if l.ID != "L1" || l.Key != "k" || l.Holder != "alice" || l.Limit != 1 || l.State != fsm.StateActive {
					t.Fatalf("granted %+v", l)
				}
				if l.Fence != h.index || l.AcquiredTick != 1 || l.ExpiresTick != 11 || l.TTLTicks != 10 || l.TTLMS != 10000 {
					t.Fatalf("fence %d acquired %d expires %d ttl %d/%d", l.Fence, l.AcquiredTick, l.ExpiresTick, l.TTLTicks, l.TTLMS)
				}
				if res[0].Queued || res[0].Replayed || h.f.Lease("L1") != l || h.f.EndTick(l) != 11 {
					t.Fatalf("result %+v, stored %+v", res[0], h.f.Lease("L1"))
				}
			}),
			eventTypes("acquired L1"),
			ticks(3),
			doCheck(acq("L2", "k", "bob", 10), wire.CodeLeaseHeld, func(t *testing.T, h *harness, res []fsm.Result) {
				e := res[0].Err
				want := []wire.HolderInfo{{Holder: "alice", LeaseID: "L1", RemainingMS: 7000}}
				if e.Key != "k" || !reflect.DeepEqual(e.Holders, want) {
					t.Fatalf("LEASE_HELD key %q holders %+v, want %+v", e.Key, e.Holders, want)
				}
				if res[0].Lease != nil || len(h.events) != 0 || h.f.Lease("L2") != nil {
					t.Fatalf("a refused acquire changed something: %+v, events %v", res[0], h.events)
				}
				text := jsonOf(t, e) + e.Error()
				for _, id := range []string{"L1", "L2"} {
					h := tok(id)
					if strings.Contains(text, hex.EncodeToString(h[:])) {
						t.Fatalf("LEASE_HELD error carries the token hash of %s: %s", id, text)
					}
				}
				if strings.Contains(strings.ToLower(text), "token") {
					t.Fatalf("LEASE_HELD error mentions a token: %s", text)
				}
			}),
			do(acq("L3", "k2", "bob", 10), ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if got := h.f.ActiveOnKey("k"); len(got) != 1 || got[0].ID != "L1" {
					t.Fatalf("active on k: %v", got)
				}
				if n, _ := h.f.Counts(); n != 2 {
					t.Fatalf("%d active leases, want 2", n)
				}
			}),
		}},

		{name: "semaphore admits exactly its limit", steps: []step{
			do(withLimit(acq("S1", "sem", "a", 10), 3), ""),
			do(withLimit(acq("S2", "sem", "b", 10), 3), ""),
			do(withLimit(acq("S3", "sem", "c", 10), 3), ""),
			doCheck(withLimit(acq("S4", "sem", "d", 10), 3), wire.CodeLeaseHeld, func(t *testing.T, h *harness, res []fsm.Result) {
				var ids []string
				for _, hi := range res[0].Err.Holders {
					ids = append(ids, hi.LeaseID)
				}
				if strings.Join(ids, ",") != "S1,S2,S3" {
					t.Fatalf("holders %v, want S1,S2,S3", ids)
				}
			}),
			do(release("S2"), ""),
			do(withLimit(acq("S5", "sem", "d", 10), 3), ""),
			do(withLimit(acq("S6", "sem", "e", 10), 3), wire.CodeLeaseHeld),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				var ids []string
				for _, l := range h.f.ActiveOnKey("sem") {
					ids = append(ids, l.ID)
				}
				if strings.Join(ids, ",") != "S1,S3,S5" {
					t.Fatalf("active %v, want S1,S3,S5", ids)
				}
			}),
		}},

		{name: "LIMIT_MISMATCH while the key is in use", steps: []step{
			do(withLimit(acq("M1", "k", "a", 10), 2), ""),
			doCheck(withLimit(acq("M2", "k", "b", 10), 3), wire.CodeLimitMismatch, func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Err.Key != "k" {
					t.Fatalf("LIMIT_MISMATCH key %q", res[0].Err.Key)
				}
			}),
			do(acq("M3", "k", "b", 10), wire.CodeLimitMismatch),
			do(withLimit(acq("M4", "k", "b", 10), 2), ""),
			do(release("M1"), ""),
			do(withLimit(acq("M5", "k", "c", 10), 3), wire.CodeLimitMismatch),
			do(release("M4"), ""),
			// The key is free again: a new limit is accepted.
			do(withLimit(acq("M6", "k", "c", 10), 3), ""),
		}},

		{name: "token checks on renew and release", steps: []step{
			do(acq("T1", "k", "a", 10), ""),
			do(&fsm.Renew{LeaseID: "T1", TokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			do(&fsm.Renew{LeaseID: "T1"}, wire.CodeLeaseTokenInvalid),
			do(&fsm.Release{LeaseID: "T1", TokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			do(&fsm.Release{LeaseID: "T1"}, wire.CodeLeaseTokenInvalid),
			// A session token does not stand in for a standalone lease's token.
			do(&fsm.Release{LeaseID: "T1", SessionTokenHash: tok("T1")}, wire.CodeLeaseTokenInvalid),
			do(&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "T1", TokenHash: badTok}}}, ""),
			do(renew("nope"), wire.CodeLeaseNotFound),
			do(release("nope"), wire.CodeLeaseNotFound),
			do(&fsm.Release{LeaseID: "", TokenHash: tok("")}, wire.CodeInvalidArgument),
			leaseIs("T1", fsm.StateActive, ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if l := h.f.Lease("T1"); l.RenewalCount != 0 || l.ExpiresTick != 11 {
					t.Fatalf("refused renewals changed the lease: %+v", l)
				}
			}),
			do(renew("T1"), ""),
			do(release("T1"), ""),
			leaseIs("T1", fsm.StateReleased, fsm.ReasonReleased),
		}},

		{name: "terminal states refuse every operation", steps: []step{
			do(acq("E", "k1", "a", 2), ""),
			do(acq("R", "k2", "a", 10), ""),
			do(acq("V", "k3", "a", 10), ""),
			do(&fsm.Release{LeaseID: "R", TokenHash: tok("R"), Reason: "done"}, ""),
			do(&fsm.Revoke{LeaseID: "V", Reason: "operator"}, ""),
			tickTo(5),
			leaseIs("E", fsm.StateExpired, fsm.ReasonExpired),
			leaseIs("R", fsm.StateReleased, "done"),
			leaseIs("V", fsm.StateRevoked, "operator"),
			do(renew("E"), wire.CodeLeaseExpired),
			do(release("E"), wire.CodeLeaseExpired),
			do(&fsm.Revoke{LeaseID: "E"}, wire.CodeLeaseExpired),
			do(renew("R"), wire.CodeLeaseReleased),
			do(release("R"), wire.CodeLeaseReleased),
			do(&fsm.Revoke{LeaseID: "R"}, wire.CodeLeaseReleased),
			do(renew("V"), wire.CodeLeaseRevoked),
			do(release("V"), wire.CodeLeaseRevoked),
			do(&fsm.Revoke{LeaseID: "V"}, wire.CodeLeaseRevoked),
			// The token is checked before the state: a stranger learns nothing.
			do(&fsm.Renew{LeaseID: "E", TokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			doCheck(&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "E", TokenHash: tok("E")}, {LeaseID: "R", TokenHash: tok("R")}}}, "",
				func(t *testing.T, h *harness, res []fsm.Result) {
					if c0, c1 := code(res[0].Items[0].Err), code(res[0].Items[1].Err); c0 != wire.CodeLeaseExpired || c1 != wire.CodeLeaseReleased {
						t.Fatalf("heartbeat item codes %s %s", c0, c1)
					}
				}),
			leaseIs("E", fsm.StateExpired, fsm.ReasonExpired),
			leaseIs("R", fsm.StateReleased, "done"),
			leaseIs("V", fsm.StateRevoked, "operator"),
		}},

		{name: "renewal extends, never shortens, counts", steps: []step{
			do(acq("R", "k", "a", 10), ""), // expires 11
			tickTo(5),
			doCheck(renew("R"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if l := res[0].Lease; l.ExpiresTick != 15 || l.RenewalCount != 1 || l.RenewedWallMS != 2 {
					t.Fatalf("after renewal: expires %d count %d wall %d", l.ExpiresTick, l.RenewalCount, l.RenewedWallMS)
				}
			}),
			eventTypes("renewed R"),
			// A shorter TTL is taken for later renewals but does not shorten this one.
			doCheck(&fsm.Renew{LeaseID: "R", TokenHash: tok("R"), TTLTicks: 2, TTLMS: 2000}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if l := res[0].Lease; l.ExpiresTick != 15 || l.TTLTicks != 2 || l.TTLMS != 2000 || l.RenewalCount != 2 {
					t.Fatalf("after short renewal: expires %d ttl %d/%d count %d", l.ExpiresTick, l.TTLTicks, l.TTLMS, l.RenewalCount)
				}
			}),
			do(&fsm.Renew{LeaseID: "R", TokenHash: tok("R"), TTLTicks: 2}, wire.CodeInvalidArgument),
			tickTo(14),
			doCheck(renew("R"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if l := res[0].Lease; l.ExpiresTick != 16 || l.RenewalCount != 3 {
					t.Fatalf("renewal at 14: expires %d count %d", l.ExpiresTick, l.RenewalCount)
				}
			}),
			doCheck(&fsm.Heartbeat{WallMS: 9, Items: []fsm.HeartbeatItem{{LeaseID: "R", TokenHash: tok("R")}, {LeaseID: "X", TokenHash: tok("X")}}}, "",
				func(t *testing.T, h *harness, res []fsm.Result) {
					it := res[0].Items
					if len(it) != 2 || it[0].LeaseID != "R" || it[0].Err != nil || it[0].Lease.RenewalCount != 4 ||
						it[1].LeaseID != "X" || code(it[1].Err) != wire.CodeLeaseNotFound {
						t.Fatalf("heartbeat items %+v", it)
					}
				}),
			do(&fsm.Heartbeat{}, wire.CodeInvalidArgument),
			tickTo(17),
			leaseIs("R", fsm.StateActive, ""),
			ticks(1),
			leaseIs("R", fsm.StateExpired, fsm.ReasonExpired),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if l := h.f.Lease("R"); l.RenewalCount != 4 || l.EndedTick() != 18 {
					t.Fatalf("expired lease: count %d ended %d", l.RenewalCount, l.EndedTick())
				}
			}),
		}},

		{name: "expiry exactly at ExpiresTick+GraceTicks", steps: []step{
			do(acq("E", "k", "a", 3), ""), // nominal end 4
			do(session("S", "a", 3), ""),
			tickTo(4 + fsm.GraceTicks - 1),
			leaseIs("E", fsm.StateActive, ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if s := h.f.Session("S"); s.State != fsm.SessionActive {
					t.Fatalf("session %s one tick early", s.State)
				}
			}),
			do(acq("E2", "k", "b", 3), wire.CodeLeaseHeld),
			ticks(1),
			leaseIs("E", fsm.StateExpired, fsm.ReasonExpired),
			eventTypes("expired E", "session_ended S"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				e := h.events[0]
				if e.Index != h.index || e.Tick != 6 || e.Key != "k" || e.Reason != fsm.ReasonExpired || e.Lease.EndedTick() != 6 {
					t.Fatalf("expired event %+v", e)
				}
				if s := h.f.Session("S"); s.State != fsm.SessionExpired || s.EndedTick != 6 {
					t.Fatalf("session %+v", s)
				}
				if n, m := h.f.Counts(); n != 0 || m != 0 {
					t.Fatalf("counts %d %d after expiry", n, m)
				}
			}),
			do(acq("E3", "k", "b", 3), ""),
		}},

		{name: "many leases expire at one tick in id order", steps: []step{
			doCheck(&fsm.Batch{Commands: []fsm.Command{
				acq("x-c", "k3", "a", 2), acq("x-a", "k1", "a", 2), acq("x-late", "k0", "a", 3),
				acq("x-b", "k2", "a", 2), acq("x-d", "k4", "b", 2),
			}}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				for i, r := range res {
					if r.Err != nil {
						t.Fatalf("batch item %d: %v", i, r.Err)
					}
				}
			}),
			tickTo(4),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if len(h.events) != 0 {
					t.Fatalf("events one tick early: %v", h.events)
				}
			}),
			ticks(1),
			eventTypes("expired x-a", "expired x-b", "expired x-c", "expired x-d"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				for i, e := range h.events {
					if e.Index != h.index || e.Seq != uint32(i) || e.Tick != 5 {
						t.Fatalf("event %d: index %d seq %d tick %d, want %d %d 5", i, e.Index, e.Seq, e.Tick, h.index, i)
					}
				}
			}),
			leaseIs("x-late", fsm.StateActive, ""),
			ticks(1),
			eventTypes("expired x-late"),
		}},

		{name: "session-bound leases live as long as the session", steps: []step{
			doCheck(session("S", "alice", 5), "", func(t *testing.T, h *harness, res []fsm.Result) {
				s := res[0].Session
				if s.State != fsm.SessionActive || s.ExpiresTick != 6 || s.Holder != "alice" || s.TTLTicks != 5 {
					t.Fatalf("session %+v", s)
				}
			}),
			eventTypes("session_created S"),
			do(session("S", "alice", 5), wire.CodeInvalidArgument),
			doCheck(bound("B1", "k", "S"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				l := res[0].Lease
				if l.SessionID != "S" || l.Holder != "alice" || l.ExpiresTick != 0 || l.TTLTicks != 0 || h.f.EndTick(l) != 6 {
					t.Fatalf("bound lease %+v end %d", l, h.f.EndTick(l))
				}
				if ids := h.f.Session("S").LeaseIDs; !reflect.DeepEqual(ids, []string{"B1"}) {
					t.Fatalf("session lease ids %v", ids)
				}
			}),
			do(func() *fsm.Acquire { a := bound("B2", "k2", "S"); a.Holder = "bob"; return a }(), wire.CodeInvalidArgument),
			do(func() *fsm.Acquire { a := bound("B2", "k2", "S"); a.SessionTokenHash = badTok; return a }(), wire.CodeLeaseTokenInvalid),
			do(bound("B2", "k2", "nope"), wire.CodeSessionNotFound),
			do(func() *fsm.Acquire { a := bound("B2", "k2", "S"); a.TTLTicks = 5; return a }(), wire.CodeInvalidArgument),
			do(func() *fsm.Acquire { a := bound("B2", "k2", "S"); a.Holder = "alice"; return a }(), ""),
			do(renew("B1"), wire.CodeInvalidArgument),
			tickTo(5),
			doCheck(&fsm.SessionHeartbeat{SessionID: "S", TokenHash: tok("S"), WallMS: 7}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				s := res[0].Session
				if s.ExpiresTick != 10 || s.HeartbeatCount != 1 || s.LastHeartbeat != 7 {
					t.Fatalf("after heartbeat %+v", s)
				}
				if end := h.f.EndTick(h.f.Lease("B1")); end != 10 {
					t.Fatalf("bound lease end %d, want 10", end)
				}
			}),
			eventTypes("session_heartbeat S"),
			do(&fsm.SessionHeartbeat{SessionID: "S", TokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			do(&fsm.SessionHeartbeat{SessionID: "nope", TokenHash: badTok}, wire.CodeSessionNotFound),
			tickTo(11),
			leaseIs("B1", fsm.StateActive, ""),
			leaseIs("B2", fsm.StateActive, ""),
			ticks(1),
			eventTypes("expired B1", "expired B2", "session_ended S"),
			leaseIs("B1", fsm.StateExpired, fsm.ReasonSessionEnded),
			leaseIs("B2", fsm.StateExpired, fsm.ReasonSessionEnded),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				s := h.f.Session("S")
				if s.State != fsm.SessionExpired || s.EndReason != fsm.ReasonExpired || !reflect.DeepEqual(s.LeaseIDs, []string{"B1", "B2"}) {
					t.Fatalf("expired session %+v", s)
				}
			}),
			do(&fsm.SessionHeartbeat{SessionID: "S", TokenHash: tok("S")}, wire.CodeSessionEnded),
			do(bound("B3", "k3", "S"), wire.CodeSessionEnded),
			do(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")}, wire.CodeSessionEnded),
		}},

		{name: "session end releases its leases", steps: []step{
			do(session("S", "alice", 10), ""),
			do(bound("C1", "k1", "S"), ""),
			do(withDelay(bound("C2", "k2", "S"), 5), ""),
			do(acq("C3", "k3", "alice", 10), ""),
			// A bound lease may be released with the session's token.
			do(&fsm.Release{LeaseID: "C1", SessionTokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			do(&fsm.Release{LeaseID: "C1", SessionTokenHash: tok("S")}, ""),
			leaseIs("C1", fsm.StateReleased, fsm.ReasonReleased),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if ids := h.f.Session("S").LeaseIDs; !reflect.DeepEqual(ids, []string{"C2"}) {
					t.Fatalf("session lease ids %v, want [C2]", ids)
				}
			}),
			do(&fsm.SessionEnd{SessionID: "S", TokenHash: badTok}, wire.CodeLeaseTokenInvalid),
			do(&fsm.SessionEnd{SessionID: "nope", TokenHash: tok("nope")}, wire.CodeSessionNotFound),
			doCheck(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if s := res[0].Session; s.State != fsm.SessionEnded || h.f.Session("S") != s {
					t.Fatalf("ended session %+v", s)
				}
			}),
			eventTypes("released C2", "session_ended S"),
			leaseIs("C2", fsm.StateReleased, fsm.ReasonSessionEnded),
			leaseIs("C3", fsm.StateActive, ""),
			// Ending a session is voluntary: no lock-delay.
			do(acq("C4", "k2", "bob", 10), ""),
			do(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")}, wire.CodeSessionEnded),
			do(session("S2", "carol", 10), ""),
			do(&fsm.SessionEnd{SessionID: "S2", Force: true}, ""),
		}},

		{name: "release-holder ends every lease and session of a holder", steps: []step{
			do(withDelay(acq("H1", "k1", "alice", 10), 5), ""),
			do(acq("H2", "k2", "alice", 10), ""),
			do(session("HS", "alice", 10), ""),
			do(bound("H3", "k3", "HS"), ""),
			do(acq("H4", "k4", "bob", 10), ""),
			doCheck(&fsm.ReleaseHolder{Holder: "alice", Reason: "restart"}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Count != 4 {
					t.Fatalf("count %d, want 4", res[0].Count)
				}
			}),
			leaseIs("H1", fsm.StateRevoked, "restart"),
			leaseIs("H2", fsm.StateRevoked, "restart"),
			leaseIs("H3", fsm.StateRevoked, "restart"),
			leaseIs("H4", fsm.StateActive, ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if s := h.f.Session("HS"); s.State != fsm.SessionEnded {
					t.Fatalf("session %s", s.State)
				}
			}),
			// No lock-delay after a holder release.
			do(acq("H5", "k1", "alice", 10), ""),
			doCheck(&fsm.ReleaseHolder{Holder: "alice"}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Count != 1 {
					t.Fatalf("count %d, want 1", res[0].Count)
				}
			}),
			leaseIs("H5", fsm.StateRevoked, fsm.ReasonHolderReleased),
			doCheck(&fsm.ReleaseHolder{Holder: "carol"}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Count != 0 || len(h.events) != 0 {
					t.Fatalf("count %d events %v", res[0].Count, h.events)
				}
			}),
			do(&fsm.ReleaseHolder{}, wire.CodeInvalidArgument),
		}},

		{name: "idempotent acquire replays and conflicts", retain: 3, steps: []step{
			do(withIdem(acq("I1", "k", "alice", 10), "op1", "fp1"), ""),
			doCheck(withIdem(acq("I2", "k", "alice", 10), "op1", "fp1"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				l := res[0].Lease
				if !res[0].Replayed || l.ID != "I1" || l != h.f.Lease("I1") || len(h.events) != 0 || h.f.Lease("I2") != nil {
					t.Fatalf("replay: %+v lease %+v events %v", res[0], l, h.events)
				}
			}),
			do(withIdem(acq("I3", "k", "alice", 10), "op1", "fp2"), wire.CodeIdempotencyConflict),
			do(withIdem(acq("I3", "other", "alice", 10), "op1", "fp2"), wire.CodeIdempotencyConflict),
			do(release("I1"), ""),
			doCheck(withIdem(acq("I4", "k", "alice", 10), "op1", "fp1"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if !res[0].Replayed || res[0].Lease.ID != "I1" || res[0].Lease.State != fsm.StateReleased {
					t.Fatalf("replay after release: %+v", res[0])
				}
			}),
			ticks(3),
			leaseGone("I1"),
			doCheck(withIdem(acq("I5", "k", "alice", 10), "op1", "fp1"), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Replayed || res[0].Lease.ID != "I5" {
					t.Fatalf("after pruning: %+v", res[0])
				}
			}),
			// A queued acquire replays as queued.
			do(withWait(withIdem(acq("I6", "k", "bob", 10), "op2", "fp"), 10), ""),
			doCheck(withWait(withIdem(acq("I7", "k", "bob", 10), "op2", "fp"), 10), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if !res[0].Replayed || !res[0].Queued || res[0].Lease.ID != "I6" {
					t.Fatalf("queued replay: %+v", res[0])
				}
			}),
			do(withWait(withIdem(acq("I7", "k", "bob", 10), "op2", "other"), 10), wire.CodeIdempotencyConflict),
		}},

		{name: "wait queue is first come first served", steps: []step{
			do(acq("Q0", "k", "alice", 50), ""),
			doCheck(withWait(acq("Q1", "k", "bob", 50), 20), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if !res[0].Queued || res[0].Lease == nil || res[0].Lease.ID != "Q1" || len(h.events) != 0 || h.f.Lease("Q1") != nil {
					t.Fatalf("queued: %+v, events %v", res[0], h.events)
				}
			}),
			do(withWait(acq("Q2", "k", "carol", 50), 20), ""),
			do(withWait(acq("Q3", "k", "dave", 50), 20), ""), // deadline tick 21
			do(acq("Q4", "k", "erin", 50), wire.CodeLeaseHeld),
			do(withWait(acq("Q1", "k", "bob", 50), 20), wire.CodeInvalidArgument), // id already queued
			do(release("Q0"), ""),
			eventTypes("released Q0", "acquired Q1"),
			noticesAre("Q1 granted"),
			leaseIs("Q1", fsm.StateActive, ""),
			ticks(2),
			do(release("Q1"), ""),
			noticesAre("Q2 granted"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if l := h.f.Lease("Q2"); l.AcquiredTick != 3 || l.ExpiresTick != 53 {
					t.Fatalf("Q2 granted at %d expiring %d, want 3 and 53", l.AcquiredTick, l.ExpiresTick)
				}
			}),
			tickTo(20),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if len(h.allNotices) != 2 {
					t.Fatalf("notices before the deadline: %+v", h.allNotices)
				}
			}),
			ticks(1),
			noticesAre("Q3 LEASE_HELD"),
			leaseGone("Q3"),
			do(release("Q2"), ""),
			noticesAre(),
			do(withWait(acq("Q5", "k", "bob", 50), 20), ""), // free: granted at once
			leaseIs("Q5", fsm.StateActive, ""),
		}},

		{name: "waiters are granted as leases expire", steps: []step{
			do(withLimit(acq("W0", "k", "a", 2), 2), ""),
			do(withLimit(acq("W1", "k", "b", 3), 2), ""),
			do(withWait(withLimit(acq("W2", "k", "c", 10), 2), 30), ""),
			do(withWait(withLimit(acq("W3", "k", "d", 10), 2), 30), ""),
			do(withWait(withLimit(acq("W4", "k", "e", 10), 2), 30), ""),
			do(withWait(acq("W5", "k", "e", 10), 30), wire.CodeLimitMismatch),
			tickTo(5),
			eventTypes("expired W0", "acquired W2"),
			noticesAre("W2 granted"),
			ticks(1),
			eventTypes("expired W1", "acquired W3"),
			noticesAre("W3 granted"),
			do(&fsm.Revoke{LeaseID: "W2"}, ""),
			noticesAre("W4 granted"),
		}},

		{name: "a waiter whose session ended is skipped", steps: []step{
			do(acq("A", "k", "alice", 50), ""),
			do(session("S", "bob", 50), ""),
			do(withWait(bound("WB", "k", "S"), 20), ""),
			do(withWait(acq("WC", "k", "carol", 50), 20), ""),
			do(&fsm.SessionEnd{SessionID: "S", TokenHash: tok("S")}, ""),
			do(release("A"), ""),
			noticesAre("WB SESSION_ENDED", "WC granted"),
			leaseGone("WB"),
			// A wait that times out during a lock-delay says so.
			do(withDelay(acq("D", "k2", "dave", 50), 10), ""),
			do(&fsm.Revoke{LeaseID: "D"}, ""),
			do(withWait(acq("WD", "k2", "erin", 50), 3), ""),
			ticks(2),
			noticesAre(),
			ticks(1),
			noticesAre("WD LOCK_DELAY"),
		}},

		{name: "a lease id queued on one key is refused on another", retain: 2, steps: []step{
			do(acq("A", "k1", "alice", 100), ""),
			do(withWait(acq("X", "k1", "bob", 100), 50), ""),
			do(acq("X", "k2", "carol", 100), wire.CodeInvalidArgument),
			do(release("A"), ""),
			noticesAre("X granted"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if l := h.f.Lease("X"); l == nil || l.Key != "k1" || l.Holder != "bob" || l.State != fsm.StateActive {
					t.Fatalf("lease X is %+v, want bob's on k1", l)
				}
				if n, _ := h.f.Counts(); n != 1 || len(h.f.ActiveOnKey("k2")) != 0 {
					t.Fatalf("%d active, on k2: %v", n, h.f.ActiveOnKey("k2"))
				}
			}),
			do(acq("B", "k2", "dave", 10), ""),
			do(acq("C", "k2", "erin", 10), wire.CodeLeaseHeld),
		}},

		{name: "release-holder also withdraws the holder's queued acquires", steps: []step{
			do(acq("H1", "k", "alice", 50), ""),
			do(withWait(acq("H2", "k", "alice", 50), 20), ""),
			do(withWait(acq("H3", "k", "bob", 50), 20), ""),
			doCheck(&fsm.ReleaseHolder{Holder: "alice"}, "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Count != 2 {
					t.Fatalf("count %d, want 2 (one lease, one queued acquire)", res[0].Count)
				}
				active := h.f.ActiveOnKey("k")
				if len(active) != 1 || active[0].Holder != "bob" {
					t.Fatalf("active on k: %+v, want bob's", active)
				}
			}),
			noticesAre("H2 LEASE_REVOKED", "H3 granted"),
		}},

		{name: "CancelWait withdraws a queued acquire", steps: []step{
			do(acq("C0", "k", "alice", 50), ""),
			do(withWait(withIdem(acq("C1", "k", "bob", 50), "op", "fp"), 20), ""),
			do(withWait(acq("C2", "k", "carol", 50), 20), ""),
			do(&fsm.CancelWait{LeaseID: "C1", Key: "k"}, ""),
			do(&fsm.CancelWait{LeaseID: "C1", Key: "k"}, ""),
			do(&fsm.CancelWait{LeaseID: "C9", Key: "nokey"}, ""),
			do(release("C0"), ""),
			noticesAre("C2 granted"),
			leaseGone("C1"),
			// The idempotency key of a cancelled wait is free again.
			doCheck(withWait(withIdem(acq("C3", "k", "bob", 50), "op", "fp"), 20), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Replayed || !res[0].Queued || res[0].Lease.ID != "C3" {
					t.Fatalf("after cancel: %+v", res[0])
				}
			}),
			do(&fsm.CancelWait{LeaseID: "C3", Key: "k"}, ""),
			do(release("C2"), ""),
			noticesAre(),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if got := h.f.ActiveOnKey("k"); len(got) != 0 {
					t.Fatalf("active after cancel and release: %v", got)
				}
			}),
		}},

		{name: "lock-delay after an involuntary end", steps: []step{
			do(withDelay(acq("D1", "k", "alice", 2), 3), ""), // expires at tick 5, blocked until 8
			tickTo(5),
			leaseIs("D1", fsm.StateExpired, fsm.ReasonExpired),
			lockDelay("X1", "k", 3000),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if got := h.f.KeyLockDelay("k"); got != 8 {
					t.Fatalf("KeyLockDelay %d, want 8", got)
				}
			}),
			ticks(1),
			lockDelay("X2", "k", 2000),
			tickTo(7),
			lockDelay("X3", "k", 1000),
			ticks(1),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				ev := h.eventsOf(fsm.EventLockDelayEnded)
				if len(ev) != 1 || ev[0].Key != "k" || ev[0].Reason != "D1" || ev[0].Tick != 8 || h.f.KeyLockDelay("k") != 0 {
					t.Fatalf("lock_delay_ended events %+v", ev)
				}
			}),
			doCheck(acq("D2", "k", "bob", 10), "", func(t *testing.T, h *harness, _ []fsm.Result) {
				if e := h.eventsOf(fsm.EventAcquired); len(e) != 1 || e[0].Previous != "D1" {
					t.Fatalf("acquired %+v, want previous D1", e)
				}
			}),
			do(release("D2"), ""),
			doCheck(acq("D3", "k", "bob", 10), "", func(t *testing.T, h *harness, _ []fsm.Result) {
				if e := h.eventsOf(fsm.EventAcquired); e[0].Previous != "" {
					t.Fatalf("previous %q after a voluntary release", e[0].Previous)
				}
			}),
			// Revocation is involuntary too; a waiter gets the slot when the delay ends.
			do(withDelay(acq("D4", "k2", "alice", 50), 2), ""),
			// It applies between ticks, so its delay counts from the next one.
			do(&fsm.Revoke{LeaseID: "D4", Reason: "stuck"}, ""),
			lockDelay("X4", "k2", 3000),
			do(withWait(acq("D5", "k2", "bob", 50), 10), ""),
			ticks(2),
			noticesAre(),
			ticks(1),
			noticesAre("D5 granted"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if e := h.eventsOf(fsm.EventAcquired); len(e) != 1 || e[0].Previous != "D4" {
					t.Fatalf("acquired %+v, want previous D4", e)
				}
			}),
			// A voluntary release never blocks the slot.
			do(withDelay(acq("D6", "k3", "alice", 50), 5), ""),
			do(release("D6"), ""),
			do(acq("D7", "k3", "bob", 10), ""),
		}},

		{name: "previous names the lease of an expired session", steps: []step{
			do(session("S", "alice", 2), ""),
			do(withDelay(bound("P1", "k", "S"), 2), ""),
			tickTo(5),
			leaseIs("P1", fsm.StateExpired, fsm.ReasonSessionEnded),
			lockDelay("X", "k", 2000),
			ticks(2),
			doCheck(acq("P2", "k", "bob", 10), "", func(t *testing.T, h *harness, _ []fsm.Result) {
				if e := h.eventsOf(fsm.EventAcquired); e[0].Previous != "P1" {
					t.Fatalf("previous %q, want P1", e[0].Previous)
				}
			}),
		}},

		{name: "fencing tokens strictly increase per key", steps: []step{
			do(&fsm.Batch{Commands: []fsm.Command{
				withLimit(acq("F1", "sem", "a", 10), 3), withLimit(acq("F2", "sem", "b", 10), 3),
				acq("G1", "k", "a", 10), release("G1"), acq("G2", "k", "b", 10),
				withLimit(acq("F3", "sem", "c", 10), 3),
			}}, ""),
			check(func(t *testing.T, h *harness, res []fsm.Result) {
				var last uint64
				for _, id := range []string{"F1", "F2", "G1", "G2", "F3"} {
					l := h.f.Lease(id)
					if l.Fence <= last || l.Fence < h.index {
						t.Fatalf("fence of %s is %d after %d (entry %d)", id, l.Fence, last, h.index)
					}
					last = l.Fence
				}
				if h.f.Fence() != last {
					t.Fatalf("Fence() %d, want %d", h.f.Fence(), last)
				}
			}),
			do(release("F1"), ""),
			doCheck(withLimit(acq("F4", "sem", "d", 10), 3), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Lease.Fence <= h.f.Lease("F3").Fence {
					t.Fatalf("fence %d not above %d", res[0].Lease.Fence, h.f.Lease("F3").Fence)
				}
			}),
		}},

		{name: "pruning removes terminal records and keeps the fence", retain: 5, steps: []step{
			do(acq("P1", "k", "a", 100), ""),
			do(acq("P2", "k2", "a", 100), ""),
			do(session("PS", "a", 100), ""),
			do(acq("P3", "k3", "a", 1), ""), // expires at tick 4
			ticks(1),
			do(release("P1"), ""), // ends at tick 2
			do(&fsm.SessionEnd{SessionID: "PS", TokenHash: tok("PS")}, ""),
			tickTo(6),
			leaseIs("P1", fsm.StateReleased, fsm.ReasonReleased),
			ticks(1),
			leaseGone("P1"),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if h.f.Session("PS") != nil {
					t.Fatal("ended session not pruned")
				}
				if h.f.Fence() != h.f.Lease("P3").Fence {
					t.Fatalf("fence %d, want %d", h.f.Fence(), h.f.Lease("P3").Fence)
				}
			}),
			do(renew("P1"), wire.CodeLeaseNotFound),
			do(&fsm.SessionHeartbeat{SessionID: "PS", TokenHash: tok("PS")}, wire.CodeSessionNotFound),
			tickTo(8),
			leaseIs("P3", fsm.StateExpired, fsm.ReasonExpired),
			ticks(1),
			leaseGone("P3"),
			tickTo(60),
			leaseIs("P2", fsm.StateActive, ""),
			doCheck(acq("P4", "k3", "a", 10), "", func(t *testing.T, h *harness, res []fsm.Result) {
				if res[0].Lease.Fence <= h.f.Lease("P2").Fence || res[0].Lease.Fence != h.f.Fence() {
					t.Fatalf("fence after pruning %d", res[0].Lease.Fence)
				}
			}),
		}},

		{name: "duplicate and stale ticks are ignored", steps: []step{
			do(acq("L", "k", "a", 1), ""), // nominal end 2, expires at 4
			do(&fsm.Tick{Tick: 1, WallMS: 99}, ""),
			do(&fsm.Tick{Tick: 0, WallMS: 99}, ""),
			do(&fsm.Tick{Tick: 10, WallMS: 99}, ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if h.f.Tick() != 1 || h.f.WallMS() != periodMS || len(h.allEvents) != 1 {
					t.Fatalf("tick %d wall %d events %d after ignored ticks", h.f.Tick(), h.f.WallMS(), len(h.allEvents))
				}
			}),
			do(&fsm.Tick{Tick: 2, WallMS: 99, PeriodMS: 5000}, ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if h.f.Tick() != 2 || h.f.WallMS() != 99 || h.f.PeriodMS() != periodMS {
					t.Fatalf("tick %d wall %d period %d", h.f.Tick(), h.f.WallMS(), h.f.PeriodMS())
				}
			}),
			do(&fsm.Batch{Commands: []fsm.Command{&fsm.Tick{Tick: 3}, &fsm.Tick{Tick: 3}, &fsm.Tick{Tick: 5}}}, ""),
			leaseIs("L", fsm.StateActive, ""),
			do(&fsm.Batch{Commands: []fsm.Command{&fsm.Tick{Tick: 4}, &fsm.Tick{Tick: 4}}}, ""),
			leaseIs("L", fsm.StateExpired, fsm.ReasonExpired),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if h.f.Tick() != 4 {
					t.Fatalf("tick %d, want 4", h.f.Tick())
				}
			}),
		}},

		{name: "events carry the index and a sequence", steps: []step{
			do(&fsm.Batch{Commands: []fsm.Command{
				session("S", "a", 10), bound("B", "k", "S"), acq("L", "k2", "a", 10), release("L"),
			}}, ""),
			eventTypes("session_created S", "acquired B", "acquired L", "released L"),
			do(renew("L"), wire.CodeLeaseReleased),
			eventTypes(),
			do(acq("L2", "k2", "a", 10), ""),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				var last fsm.Event
				for i, e := range h.allEvents {
					if i > 0 && e.Index == last.Index && e.Seq != last.Seq+1 ||
						i > 0 && e.Index != last.Index && (e.Index < last.Index || e.Seq != 0) || i == 0 && e.Seq != 0 {
						t.Fatalf("event %d (index %d seq %d) after (index %d seq %d)", i, e.Index, e.Seq, last.Index, last.Seq)
					}
					last = e
				}
				if last.Index != h.index || last.Seq != 0 || last.Tick != 1 || last.WallMS != 1 {
					t.Fatalf("last event %+v", last)
				}
			}),
		}},

		{name: "validation refuses bad requests", steps: []step{
			do(acq("V", "", "a", 10), wire.CodeInvalidArgument),
			do(acq("V", "a\x01b", "a", 10), wire.CodeInvalidArgument),
			do(acq("V", "a\u0085b", "a", 10), wire.CodeInvalidArgument),
			do(acq("V", strings.Repeat("k", fsm.MaxKeyBytes+1), "a", 10), wire.CodeInvalidArgument),
			do(acq("V", strings.Repeat("k", fsm.MaxKeyBytes), "a", 10), ""),
			do(acq("V2", "k", "", 10), wire.CodeInvalidArgument),
			do(acq("V2", "k", strings.Repeat("h", fsm.MaxHolderBytes+1), 10), wire.CodeInvalidArgument),
			do(withLimit(acq("V2", "k", "a", 10), 0), wire.CodeInvalidArgument),
			do(withLimit(acq("V2", "k", "a", 10), fsm.MaxLimit+1), wire.CodeInvalidArgument),
			do(acq("V2", "k", "a", 0), wire.CodeInvalidArgument),
			do(acq("", "k", "a", 10), wire.CodeInvalidArgument),
			do(acq(strings.Repeat("i", fsm.MaxIDBytes+1), "k", "a", 10), wire.CodeInvalidArgument),
			do(func() *fsm.Acquire { a := acq("V2", "k", "a", 10); a.TokenHash = fsm.Hash{}; return a }(), wire.CodeInvalidArgument),
			do(func() *fsm.Acquire {
				a := acq("V2", "k", "a", 10)
				a.Metadata = map[string]string{}
				for i := range fsm.MaxMetaEntries + 1 {
					a.Metadata[fmt.Sprint(i)] = "v"
				}
				return a
			}(), wire.CodeInvalidArgument),
			do(func() *fsm.Acquire {
				a := acq("V2", "k", "a", 10)
				a.Metadata = map[string]string{"big": strings.Repeat("v", fsm.MaxMetaBytes)}
				return a
			}(), wire.CodeInvalidArgument),
			do(acq("V", "k", "a", 10), wire.CodeInvalidArgument), // duplicate id
			do(&fsm.Release{LeaseID: "V", TokenHash: tok("V"), Reason: strings.Repeat("r", fsm.MaxReasonBytes+1)}, wire.CodeInvalidArgument),
			do(session("S", "a", 0), wire.CodeInvalidArgument),
			do(session("", "a", 10), wire.CodeInvalidArgument),
			do(session("S", "", 10), wire.CodeInvalidArgument),
			check(func(t *testing.T, h *harness, _ []fsm.Result) {
				if n, m := h.f.Counts(); n != 1 || m != 0 || len(h.allEvents) != 1 {
					t.Fatalf("counts %d %d, %d events after refused requests", n, m, len(h.allEvents))
				}
			}),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.retain = tt.retain
			h.tick(1)
			for i, s := range tt.steps {
				var res []fsm.Result
				switch {
				case s.cmd != nil:
					res = h.apply(s.cmd)
					wantCode(t, fmt.Sprintf("step %d (%T at tick %d)", i, s.cmd, h.f.Tick()), res[0].Err, s.want)
				case s.ticks > 0:
					h.tick(s.ticks)
				case s.to > 0:
					h.tickTo(s.to)
				}
				if s.check != nil {
					t.Run(fmt.Sprintf("step %d", i), func(t *testing.T) { s.check(t, h, res) })
					if t.Failed() {
						t.FailNow()
					}
				}
			}
		})
	}
}

func TestApplyPanicsOnOldIndex(t *testing.T) {
	f := fsm.New()
	f.Apply(5, &fsm.Tick{Tick: 1})
	for _, idx := range []uint64{5, 4} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Apply at index %d after 5 did not panic", idx)
				}
			}()
			f.Apply(idx, &fsm.Tick{Tick: 2})
		}()
	}
	if f.Tick() != 1 || f.Index() != 5 {
		t.Fatalf("tick %d index %d after refused applies", f.Tick(), f.Index())
	}
}
