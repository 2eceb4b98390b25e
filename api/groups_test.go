package api

import (
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestGroupRoutes: the lease group routes read their bodies and headers
// into the node's requests and answer with its group (201 and Location on
// a grant, 200 on a replay); a missing token header or an unknown field is
// refused before the node is called.
func TestGroupRoutes(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	rec := do(t, h, "POST", "/v1/groups", `{"keys":[{"key":"dedup/s1"},{"key":"tuners","limit":4}],"holder":"w1","session_id":"ss_1",`+
		`"metadata":{"a":"b"},"idempotency_key":"i1","wait_ms":100,"lock_delay_ms":200}`, "X-Session-Token", "st")
	if rec.Code != 201 || rec.Header().Get("Location") != "/v1/groups/lg_1" {
		t.Fatalf("acquire: %d %s %v", rec.Code, rec.Body, rec.Header())
	}
	want := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "dedup/s1"}, {Key: "tuners", Limit: 4}}, Holder: "w1",
		SessionID: "ss_1", SessionToken: "st", Metadata: map[string]string{"a": "b"}, IdempotencyKey: "i1", WaitMS: 100, LockDelayMS: 200}
	if c := f.only(t, "AcquireGroup"); !reflect.DeepEqual(c.args, []any{want}) {
		t.Fatalf("args %#v", c.args)
	}
	var g wire.LeaseGroup
	jsonOf(t, rec, &g)
	if g.GroupID != "lg_1" || g.Token != "secret" || len(g.Leases) != 2 || g.Leases[1].GroupID != "lg_1" {
		t.Fatalf("answer %+v", g)
	}
	if !strings.Contains(rec.Body.String(), `"group_id":"lg_1"`) {
		t.Fatalf("members do not carry group_id: %s", rec.Body)
	}
	f = newFake()
	f.replayed = true
	if rec := do(t, New(f, Options{}), "POST", "/v1/groups", `{"keys":[{"key":"a"}],"holder":"w","ttl_ms":5000}`); rec.Code != 200 {
		t.Fatalf("replay: %d", rec.Code)
	}

	for _, tt := range []struct {
		method, path, body string
		hdr                []string
		call               string
		args               []any
	}{
		{"GET", "/v1/groups/lg_7?stale=true", "", nil, "GetGroup", []any{"lg_7", true}},
		{"POST", "/v1/groups/lg_7/renew", `{"ttl_ms":3000}`, []string{"X-Lease-Token", "gt"}, "RenewGroup",
			[]any{wire.GroupRenewRequest{GroupID: "lg_7", Token: "gt", TTLMS: 3000}}},
		{"POST", "/v1/groups/lg_7/renew", "", []string{"X-Lease-Token", "gt"}, "RenewGroup",
			[]any{wire.GroupRenewRequest{GroupID: "lg_7", Token: "gt"}}},
		{"DELETE", "/v1/groups/lg_7?reason=done", "", []string{"X-Session-Token", "st"}, "ReleaseGroup",
			[]any{wire.GroupReleaseRequest{GroupID: "lg_7", SessionToken: "st", Reason: "done"}}},
	} {
		f := newFake()
		rec := do(t, New(f, Options{}), tt.method, tt.path, tt.body, tt.hdr...)
		if rec.Code != 200 {
			t.Fatalf("%s %s: %d %s", tt.method, tt.path, rec.Code, rec.Body)
		}
		if c := f.only(t, tt.call); !reflect.DeepEqual(c.args, tt.args) {
			t.Fatalf("%s %s: args %#v, want %#v", tt.method, tt.path, c.args, tt.args)
		}
	}

	for _, tt := range []struct {
		method, path, body, field string
	}{
		{"POST", "/v1/groups/lg_7/renew", "", headerLeaseToken},
		{"DELETE", "/v1/groups/lg_7", "", headerLeaseToken},
		{"POST", "/v1/groups", `{"key":"a","holder":"w","ttl_ms":5000}`, "key"},
		{"POST", "/v1/groups", `{"keys":[{"key":"a","ttl_ms":5}],"holder":"w"}`, "ttl_ms"},
		{"POST", "/v1/groups", `{"keys":"a"}`, "keys"},
	} {
		f := newFake()
		wantError(t, do(t, New(f, Options{}), tt.method, tt.path, tt.body), 400, wire.CodeInvalidArgument, tt.field)
		if len(f.called()) != 0 {
			t.Fatalf("%s %s %s reached the node", tt.method, tt.path, tt.body)
		}
	}
}

// TestGroupsRealNode: the lease group routes on a real node: a group is
// granted whole (201, one lease per key with its own fencing token, the
// group's token), a busy key refuses it with 409 LEASE_HELD naming that key
// and its holder and nothing is granted, members list with group_id and
// refuse renew and release of their own (400), the group renews and
// releases whole.
func TestGroupsRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, srv := realNodeAPI(t, Options{})
	h := srv.Config.Handler
	var x wire.Lease
	jsonOf(t, do(t, h, "POST", "/v1/leases", `{"key":"lease:tuner","holder":"other","ttl_ms":30000,"limit":1}`), &x)

	body := `{"keys":[{"key":"lease:service:s1"},{"key":"lease:tuner","limit":1}],"holder":"worker-a","ttl_ms":30000}`
	e := wantError(t, do(t, h, "POST", "/v1/groups", body), 409, wire.CodeLeaseHeld, "")
	if e.Key != "lease:tuner" || len(e.Holders) != 1 || e.Holders[0].Holder != "other" || e.Holders[0].LeaseID != x.LeaseID {
		t.Fatalf("refusal %+v", e)
	}
	var list wire.LeaseList
	jsonOf(t, do(t, h, "GET", "/v1/leases?holder=worker-a", ""), &list)
	if len(list.Leases) != 0 {
		t.Fatalf("a refused group left %+v", list.Leases)
	}
	wantError(t, do(t, h, "POST", "/v1/groups", `{"keys":[{"key":"a"},{"key":"a"}],"holder":"w","ttl_ms":30000}`), 400, wire.CodeInvalidArgument, "keys")
	wantError(t, do(t, h, "POST", "/v1/groups", `{"keys":[],"holder":"w","ttl_ms":30000}`), 400, wire.CodeInvalidArgument, "keys")
	wantError(t, do(t, h, "POST", "/v1/groups", `{"keys":[{"key":"a","limit":0},{"key":"_leasehold/x"}],"holder":"w","ttl_ms":30000}`), 400, wire.CodeInvalidArgument, "key")

	do(t, h, "DELETE", "/v1/leases/"+x.LeaseID, "", "X-Lease-Token", x.Token)
	rec := do(t, h, "POST", "/v1/groups", body)
	if rec.Code != 201 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	var g wire.LeaseGroup
	jsonOf(t, rec, &g)
	if len(g.Leases) != 2 || g.Token == "" || g.Leases[0].Key != "lease:service:s1" || g.Leases[1].FencingToken <= x.FencingToken {
		t.Fatalf("group %+v", g)
	}
	jsonOf(t, do(t, h, "GET", "/v1/leases?holder=worker-a&state=active", ""), &list)
	if len(list.Leases) != 2 || list.Leases[0].GroupID != g.GroupID || list.Leases[1].GroupID != g.GroupID {
		t.Fatalf("listed members %+v", list.Leases)
	}
	member := g.Leases[0].LeaseID
	wantError(t, do(t, h, "POST", "/v1/leases/"+member+"/renew", "", "X-Lease-Token", g.Token), 400, wire.CodeInvalidArgument, "lease_id")
	wantError(t, do(t, h, "DELETE", "/v1/leases/"+member, "", "X-Lease-Token", g.Token), 400, wire.CodeInvalidArgument, "lease_id")
	wantError(t, do(t, h, "POST", "/v1/groups/"+g.GroupID+"/renew", "", "X-Lease-Token", "wrong"), 403, wire.CodeLeaseTokenInvalid, "")
	wantError(t, do(t, h, "GET", "/v1/groups/lg_nope", ""), 404, wire.CodeLeaseNotFound, "")

	var rg wire.LeaseGroup
	jsonOf(t, do(t, h, "POST", "/v1/groups/"+g.GroupID+"/renew", `{"ttl_ms":20000}`, "X-Lease-Token", g.Token), &rg)
	if rg.TTLMS != 20000 || rg.Leases[0].RenewalCount != 1 || rg.Leases[1].RenewalCount != 1 || rg.Token != "" {
		t.Fatalf("renewed %+v", rg)
	}
	jsonOf(t, do(t, h, "DELETE", "/v1/groups/"+g.GroupID+"?reason=stopped", "", "X-Lease-Token", g.Token), &rg)
	if rg.State != "released" || rg.Leases[1].EndReason != "stopped" {
		t.Fatalf("released %+v", rg)
	}
	var got wire.LeaseGroup
	jsonOf(t, do(t, h, "GET", "/v1/groups/"+g.GroupID, ""), &got)
	if got.State != "released" || len(got.Leases) != 2 {
		t.Fatalf("GET after release %+v", got)
	}
}
