package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestRenewMetadataRealNode: a renewal or heartbeat item may carry
// metadata, which replaces the lease's (GET, listings and the renewed event
// show it); metadata past its limits is refused (400 INVALID_ARGUMENT
// naming metadata, or 413 past the body limit) and changes nothing.
func TestRenewMetadataRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, srv := realNodeAPI(t, Options{})
	h := srv.Config.Handler
	rec := do(t, h, "POST", "/v1/leases", `{"key":"camera/1","holder":"runner-1","ttl_ms":30000,"metadata":{"shard":"3"}}`)
	if rec.Code != 201 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	var l wire.Lease
	jsonOf(t, rec, &l)
	renew := func(body string) *httptest.ResponseRecorder {
		return do(t, h, "POST", "/v1/leases/"+l.LeaseID+"/renew", body, "X-Lease-Token", l.Token)
	}
	get := func() wire.Lease {
		t.Helper()
		var g wire.Lease
		jsonOf(t, do(t, h, "GET", "/v1/leases/"+l.LeaseID, ""), &g)
		return g
	}

	rec = renew(`{"metadata":{"frames":"1200","fps":"29.9"}}`)
	if rec.Code != 200 {
		t.Fatalf("renew with metadata: %d %s", rec.Code, rec.Body)
	}
	var rl wire.Lease
	jsonOf(t, rec, &rl)
	if rl.Metadata["frames"] != "1200" || rl.Metadata["shard"] != "" || rl.RenewalCount != 1 {
		t.Fatalf("renewed lease: %+v", rl)
	}
	if g := get(); g.Metadata["fps"] != "29.9" || len(g.Metadata) != 2 {
		t.Fatalf("GET after renew: %+v", g.Metadata)
	}

	// Refusals change nothing.
	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprint("k", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	wantError(t, renew(`{"metadata":`+string(manyJSON)+`}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, renew(`{"metadata":{"big":"`+strings.Repeat("x", 5000)+`"}}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, renew(`{"metadata":{"big":"`+strings.Repeat("x", 70<<10)+`"}}`), 413, wire.CodePayloadTooLarge, "")
	wantError(t, renew(`{"metadata":{"a":1}}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, renew(`{"stats":{"a":"1"}}`), 400, wire.CodeInvalidArgument, "stats")
	hb := fmt.Sprintf(`{"leases":[{"lease_id":%q,"token":%q,"metadata":%s}]}`, l.LeaseID, l.Token, manyJSON)
	e := wantError(t, do(t, h, "POST", "/v1/heartbeat", hb), 400, wire.CodeInvalidArgument, "metadata")
	if !strings.Contains(e.Message, "leases[0]") {
		t.Errorf("heartbeat error does not name the item: %q", e.Message)
	}
	if g := get(); g.Metadata["fps"] != "29.9" || len(g.Metadata) != 2 || g.RenewalCount != 1 {
		t.Fatalf("refused renewals changed the lease: %+v", g)
	}

	// Without metadata, or null: unchanged.
	for _, body := range []string{"", `{"ttl_ms":20000}`, `{"metadata":null}`} {
		if rec := renew(body); rec.Code != 200 {
			t.Fatalf("renew %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	if g := get(); g.Metadata["fps"] != "29.9" || g.RenewalCount != 4 || g.TTLMS != 20000 {
		t.Fatalf("plain renewals changed the metadata: %+v", g)
	}

	// A heartbeat item with metadata; another without.
	rec = do(t, h, "POST", "/v1/leases", `{"key":"camera/2","holder":"runner-1","ttl_ms":30000,"metadata":{"shard":"4"}}`)
	var l2 wire.Lease
	jsonOf(t, rec, &l2)
	hb = fmt.Sprintf(`{"leases":[{"lease_id":%q,"token":%q,"metadata":{"processing_stats":"{\"frames\":7}"}},{"lease_id":%q,"token":%q}]}`,
		l.LeaseID, l.Token, l2.LeaseID, l2.Token)
	rec = do(t, h, "POST", "/v1/heartbeat", hb)
	var ans heartbeatAnswer
	jsonOf(t, rec, &ans)
	if len(ans.Results) != 2 || !ans.Results[0].OK || !ans.Results[1].OK {
		t.Fatalf("heartbeat: %d %+v", rec.Code, ans)
	}
	var list wire.LeaseList
	jsonOf(t, do(t, h, "GET", "/v1/leases?holder=runner-1", ""), &list)
	got := map[string]map[string]string{}
	for _, x := range list.Leases {
		got[x.Key] = x.Metadata
	}
	if got["camera/1"]["processing_stats"] != `{"frames":7}` || len(got["camera/1"]) != 1 || got["camera/2"]["shard"] != "4" {
		t.Fatalf("listing: %v", got)
	}

	// {} clears.
	if rec := renew(`{"metadata":{}}`); rec.Code != 200 {
		t.Fatalf("clear: %d %s", rec.Code, rec.Body)
	}
	if g := get(); g.Metadata != nil {
		t.Fatalf("after clearing: %v", g.Metadata)
	}

	// The keep-alive stream takes metadata too.
	s, _ := openKeepAlive(t, srv.URL, "")
	s.send(t, fmt.Sprintf(`{"id":1,"lease_id":%q,"token":%q,"metadata":{"via":"stream"}}`, l.LeaseID, l.Token))
	if a := s.next(t); !a.OK {
		t.Fatalf("keep-alive renewal: %+v", a)
	}
	s.send(t, fmt.Sprintf(`{"id":2,"lease_id":%q,"token":%q,"metadata":%s}`, l.LeaseID, l.Token, manyJSON))
	if a := s.next(t); a.OK || a.Status != 400 || a.Error.Field != "metadata" {
		t.Fatalf("keep-alive renewal past the limits: %+v", a)
	}
	if g := get(); g.Metadata["via"] != "stream" {
		t.Fatalf("after keep-alive: %v", g.Metadata)
	}

	// The renewed events carry the new metadata, in order.
	resp, cancel := openStream(t, srv, "/v1/events?from=start&key=camera/1")
	defer cancel()
	br := bufio.NewReader(resp.Body)
	var seen []string
	for len(seen) < 7 {
		m, err := readSSE(t, br)
		if err != nil {
			t.Fatalf("stream: %v (got %v)", err, seen)
		}
		if m.comment || m.event != "renewed" {
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal([]byte(m.data), &ev); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(ev.Lease.Metadata)
		seen = append(seen, string(b))
	}
	want := []string{`{"fps":"29.9","frames":"1200"}`, `{"fps":"29.9","frames":"1200"}`, `{"fps":"29.9","frames":"1200"}`, `{"fps":"29.9","frames":"1200"}`,
		`{"processing_stats":"{\"frames\":7}"}`, `null`, `{"via":"stream"}`}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Fatalf("renewed events' metadata:\n%v\nwant\n%v", seen, want)
	}
}
