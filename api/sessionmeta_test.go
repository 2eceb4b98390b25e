package api

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestSessionHeartbeatMetadataRealNode: POST /v1/sessions/:id/heartbeat
// may carry {"metadata"} (a worker's statistics), which replaces the
// session's; GET and listings show it; metadata past its limits is refused
// (400 INVALID_ARGUMENT naming metadata, or 413 past the body limit) and
// changes nothing; no body, or null, leaves it; {} clears it.
func TestSessionHeartbeatMetadataRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	_, srv := realNodeAPI(t, Options{})
	h := srv.Config.Handler
	rec := do(t, h, "POST", "/v1/sessions", `{"holder":"worker-1","ttl_ms":30000,"metadata":{"role":"camera"}}`)
	if rec.Code != 201 {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	var s wire.Session
	jsonOf(t, rec, &s)
	beat := func(body string) *httptest.ResponseRecorder {
		return do(t, h, "POST", "/v1/sessions/"+s.SessionID+"/heartbeat", body, "X-Session-Token", s.Token)
	}
	get := func() wire.Session {
		t.Helper()
		var g wire.Session
		jsonOf(t, do(t, h, "GET", "/v1/sessions/"+s.SessionID, ""), &g)
		return g
	}

	rec = beat(`{"metadata":{"frames":"1200","shards":"3"}}`)
	if rec.Code != 200 {
		t.Fatalf("heartbeat with metadata: %d %s", rec.Code, rec.Body)
	}
	var hb wire.Session
	jsonOf(t, rec, &hb)
	if hb.Metadata["frames"] != "1200" || hb.Metadata["role"] != "" || hb.HeartbeatCount != 1 || hb.Token != "" {
		t.Fatalf("heartbeat answer: %+v", hb)
	}
	if g := get(); g.Metadata["shards"] != "3" || len(g.Metadata) != 2 {
		t.Fatalf("GET after heartbeat: %+v", g.Metadata)
	}

	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprint("k", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	wantError(t, beat(`{"metadata":`+string(manyJSON)+`}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, beat(`{"metadata":{"big":"`+strings.Repeat("x", 5000)+`"}}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, beat(`{"metadata":{"big":"`+strings.Repeat("x", 70<<10)+`"}}`), 413, wire.CodePayloadTooLarge, "")
	wantError(t, beat(`{"metadata":{"a":1}}`), 400, wire.CodeInvalidArgument, "metadata")
	wantError(t, beat(`{"metadata":`), 400, wire.CodeInvalidArgument, "")
	if g := get(); g.Metadata["frames"] != "1200" || len(g.Metadata) != 2 || g.HeartbeatCount != 1 {
		t.Fatalf("refused heartbeats changed the session: %+v", g)
	}

	for _, body := range []string{"", `{}`, `{"metadata":null}`} {
		if rec := beat(body); rec.Code != 200 {
			t.Fatalf("heartbeat %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	if g := get(); g.Metadata["frames"] != "1200" || g.HeartbeatCount != 4 {
		t.Fatalf("plain heartbeats changed the metadata: %+v", g)
	}
	var list wire.SessionList
	jsonOf(t, do(t, h, "GET", "/v1/sessions?holder=worker-1", ""), &list)
	if len(list.Sessions) != 1 || list.Sessions[0].Metadata["shards"] != "3" {
		t.Fatalf("listing: %+v", list)
	}
	if rec := beat(`{"metadata":{}}`); rec.Code != 200 {
		t.Fatalf("clear: %d %s", rec.Code, rec.Body)
	}
	if g := get(); g.Metadata != nil {
		t.Fatalf("after clearing: %v", g.Metadata)
	}
}
