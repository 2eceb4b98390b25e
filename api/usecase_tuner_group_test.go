package api

import (
	"fmt"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// Tuner slots with a lease group (docs/use-cases.md): the worker takes the
// service's dedup lease and a tuner slot in one request, all or nothing,
// so it never holds one without the other and never has to undo the
// first when the second is busy.

// startGroup is handleStart with one group acquire: the dedup lease and a
// tuner slot under the intent's idempotency key, bound to the worker's
// session when session is set.
func (g *gateway) startGroup(sref, profile, bucket string, session *wire.Session) (int, wire.LeaseGroup, *wire.Error) {
	g.e.t.Helper()
	body := fmt.Sprintf(`{"keys":[{"key":"lease:service:%s"},{"key":"lease:tuner","limit":%d}],"holder":%q,"idempotency_key":%q,"metadata":{"profile":%q,"bucket":%q}`,
		sref, g.tuners, g.holder, intentKey(sref, profile, bucket), profile, bucket)
	hdr := []string{"Authorization", "Bearer " + writeToken}
	if session != nil {
		body += fmt.Sprintf(`,"session_id":%q}`, session.SessionID)
		hdr = append(hdr, "X-Session-Token", session.Token)
	} else {
		body += `,"ttl_ms":30000}`
	}
	rec := g.e.call("POST", "/v1/groups", body, hdr...)
	var grp wire.LeaseGroup
	switch rec.Code {
	case 200, 201:
		jsonOf(g.e.t, rec, &grp)
		return rec.Code, grp, nil
	case 409:
		return rec.Code, grp, errorOf(g.e.t, rec)
	}
	g.e.t.Fatalf("group start: %d %s", rec.Code, rec.Body)
	return 0, grp, nil
}

func TestUseCaseTunerSlotsGroup(t *testing.T) {
	e := newUseCaseEnv(t, Options{Tokens: testTokens(t)})
	write := []string{"Authorization", "Bearer " + writeToken}
	read := []string{"Authorization", "Bearer " + readToken}

	t.Run("concurrent identical intents get one group: one dedup lease and one tuner slot, the same token", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-a", tuners: 2}
		const parallel = 8
		type res struct {
			status int
			grp    wire.LeaseGroup
			busy   *wire.Error
		}
		out := make([]res, parallel)
		var wg sync.WaitGroup
		for i := range parallel {
			wg.Go(func() {
				s, grp, busy := g.startGroup("1:0:19:283D", "hd", "0", nil)
				out[i] = res{s, grp, busy}
			})
		}
		wg.Wait()
		created := 0
		for i, r := range out {
			if r.busy != nil {
				t.Fatalf("intent %d: %v", i, r.busy)
			}
			if r.status == 201 {
				created++
			}
			if r.grp.GroupID != out[0].grp.GroupID || r.grp.Token != out[0].grp.Token || r.grp.Token == "" {
				t.Fatalf("intent %d got group %s, intent 0 %s", i, r.grp.GroupID, out[0].grp.GroupID)
			}
		}
		if created != 1 {
			t.Fatalf("%d intents created a group, want 1", created)
		}
		if tuners := g.activeTuners(); len(tuners) != 1 || tuners[0].GroupID != out[0].grp.GroupID {
			t.Fatalf("active tuners %+v", tuners)
		}
		rec := e.call("DELETE", "/v1/groups/"+out[0].grp.GroupID, "", append(write, "X-Lease-Token", out[0].grp.Token)...)
		if rec.Code != 200 {
			t.Fatalf("release: %d %s", rec.Code, rec.Body)
		}
	})

	t.Run("no free tuner: 409 names the tuner key and its holders, and no dedup lease is left to undo", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-b", tuners: 1}
		_, first, busy := g.startGroup("svc-1", "hd", "0", nil)
		if busy != nil {
			t.Fatal(busy)
		}
		status, _, busy := g.startGroup("svc-2", "hd", "0", nil)
		if status != 409 || busy.Code != wire.CodeLeaseHeld || busy.Key != "lease:tuner" || len(busy.Holders) != 1 ||
			busy.Holders[0].Holder != "worker-b" || busy.Holders[0].LeaseID != first.Leases[1].LeaseID {
			t.Fatalf("second service: %d %+v", status, busy)
		}
		if ls := e.list("key=lease:service:svc-2", read...); len(ls) != 0 {
			t.Fatalf("the busy start left a dedup lease: %+v", ls)
		}
		e.call("DELETE", "/v1/groups/"+first.GroupID, "", append(write, "X-Lease-Token", first.Token)...)
	})

	t.Run("a group bound to the worker's session ends with it", func(t *testing.T) {
		g := &gateway{e: e, holder: "worker-c", tuners: 2}
		s := e.session(201, "POST", "/v1/sessions", `{"holder":"worker-c","ttl_ms":30000}`, write...)
		_, grp, busy := g.startGroup("svc-3", "sd", "1", &s)
		if busy != nil {
			t.Fatal(busy)
		}
		if grp.SessionID != s.SessionID || grp.Leases[0].SessionID != s.SessionID {
			t.Fatalf("group %+v", grp)
		}
		rec := e.call("DELETE", "/v1/sessions/"+s.SessionID, "", append(write, "X-Session-Token", s.Token)...)
		if rec.Code != 200 {
			t.Fatalf("end session: %d %s", rec.Code, rec.Body)
		}
		var got wire.LeaseGroup
		jsonOf(t, e.call("GET", "/v1/groups/"+grp.GroupID, "", read...), &got)
		for _, l := range got.Leases {
			if l.State != "released" || l.EndReason != "session_ended" {
				t.Fatalf("member after the session ended: %+v", l)
			}
		}
	})

	t.Run("a read token cannot take a group, and the refusal changes nothing", func(t *testing.T) {
		rec := e.call("POST", "/v1/groups", `{"keys":[{"key":"lease:service:svc-4"}],"holder":"w","ttl_ms":30000}`, read...)
		if rec.Code != 403 {
			t.Fatalf("read token: %d %s", rec.Code, rec.Body)
		}
		if ls := e.list("key=lease:service:svc-4", read...); len(ls) != 0 {
			t.Fatalf("left %+v", ls)
		}
	})
}
