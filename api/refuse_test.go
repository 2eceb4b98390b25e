package api

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestSessionHeartbeatRefusesUnknownFields: the session heartbeat's
// optional body is decoded strictly, as every other body (it answered 200
// to {"bogus":1}); no body and {} still renew.
func TestSessionHeartbeatRefusesUnknownFields(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	rec := do(t, h, "POST", "/v1/sessions/ss_1/heartbeat", `{"bogus":1}`, "X-Session-Token", "st")
	wantError(t, rec, 400, wire.CodeInvalidArgument, "bogus")
	if cs := f.called(); len(cs) != 0 {
		t.Fatalf("a refused heartbeat reached the node: %v", cs)
	}
	for _, body := range []string{"", "{}"} {
		if rec := do(t, h, "POST", "/v1/sessions/ss_1/heartbeat", body, "X-Session-Token", "st"); rec.Code != 200 {
			t.Fatalf("heartbeat with body %q: %d %s", body, rec.Code, rec.Body)
		}
	}
}

// TestNoBodyRoutesRefuseABody: every route that takes no body answers one
// 400, naming its first field, before it reaches the node; white space is
// no body.
func TestNoBodyRoutesRefuseABody(t *testing.T) {
	s := New(newFake(), Options{}).(*server)
	n := 0
	for _, rt := range s.routes() {
		if rt.flags&body != 0 {
			continue
		}
		n++
		path := strings.NewReplacer(":id", "x1", ":holder", "h").Replace(rt.path)
		f := newFake()
		rec := do(t, New(f, Options{}), rt.method, path, `{"bogus":1,"other":2}`, "X-Session-Token", "st")
		if e := wantError(t, rec, 400, wire.CodeInvalidArgument, "bogus"); !strings.Contains(e.Message, "takes no request body") {
			t.Errorf("%s %s: message %q", rt.method, rt.path, e.Message)
		}
		rec = do(t, New(f, Options{}), rt.method, path, `[1,2]`, "X-Session-Token", "st")
		wantError(t, rec, 400, wire.CodeInvalidArgument, "")
		if cs := f.called(); len(cs) != 0 {
			t.Errorf("%s %s: a refused request reached the node: %v", rt.method, rt.path, cs)
		}
		if rt.method == "GET" && rt.path != "/v1/events" && rt.path != "/v1/cluster/snapshot" {
			if rec := do(t, New(newFake(), Options{}), rt.method, path, " \n", "X-Session-Token", "st"); rec.Code >= 400 && errorOf(t, rec).Field == "" && strings.Contains(errorOf(t, rec).Message, "body") {
				t.Errorf("%s %s: white space refused as a body: %s", rt.method, rt.path, rec.Body)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d routes without a body", n)
	}
}

// TestBodyNotUTF8: a body that is not UTF-8 is refused, not decoded with
// U+FFFD in its strings.
func TestBodyNotUTF8(t *testing.T) {
	f := newFake()
	rec := do(t, New(f, Options{}), "POST", "/v1/sessions", "{\"holder\":\"w\xff\xfe\",\"ttl_ms\":5000}")
	if e := wantError(t, rec, 400, wire.CodeInvalidArgument, ""); !strings.Contains(e.Message, "UTF-8 (at byte 12)") {
		t.Fatalf("message %q", e.Message)
	}
	if cs := f.called(); len(cs) != 0 {
		t.Fatalf("reached the node: %v", cs)
	}
}

// TestStaleIsStrict: ?stale=maybe is a 400 on every read that takes it
// (GET /v1/cluster took it as false).
func TestStaleIsStrict(t *testing.T) {
	h := New(newFake(), Options{})
	for _, path := range []string{"/v1/cluster", "/v1/leases", "/v1/leases/ls_1", "/v1/sessions", "/v1/sessions/ss_1", "/v1/groups/g1", "/v1/keys"} {
		wantError(t, do(t, h, "GET", path+"?stale=maybe", ""), 400, wire.CodeInvalidArgument, "stale")
		if rec := do(t, h, "GET", path+"?stale", ""); rec.Code >= 400 && errorOf(t, rec).Field == "stale" {
			t.Errorf("%s?stale: %s", path, rec.Body)
		}
	}
}

// TestOutOfRangeCarriesBounds: a real node's INVALID_ARGUMENT for a value
// out of range names the field and carries min and max.
func TestOutOfRangeCarriesBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h := New(FromNode(n), Options{})
	waitFor(t, "the node to be ready", func() bool { return do(t, h, "GET", "/readyz", "").Code == 200 })
	for _, c := range []struct {
		method, path, body, field string
		min, max                  int64
	}{
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5}`, "ttl_ms", cfg.MinTTL.Milliseconds(), cfg.MaxTTL.Milliseconds()},
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5000,"wait_ms":999999999999}`, "wait_ms", 0, cfg.MaxWait.Milliseconds()},
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5000,"limit":10001}`, "limit", 1, 10000},
		{"POST", "/v1/leases", `{"key":"` + strings.Repeat("k", 513) + `","holder":"h","ttl_ms":5000}`, "key", 1, 512},
		{"POST", "/v1/sessions", `{"holder":"h","ttl_ms":1}`, "ttl_ms", cfg.MinTTL.Milliseconds(), cfg.MaxTTL.Milliseconds()},
		{"GET", "/v1/leases?limit=1001", ``, "limit", 1, 1000},
		{"GET", "/v1/cluster/local?timeout_ms=60001", ``, "timeout_ms", 1, 60000},
	} {
		rec := do(t, h, c.method, c.path, c.body)
		e := wantError(t, rec, http.StatusBadRequest, wire.CodeInvalidArgument, c.field)
		lo, hi, ok := e.Bounds()
		if !ok || lo != c.min || hi != c.max {
			t.Errorf("%s %s: bounds %d-%d (%v), want %d-%d: %s", c.method, c.path, lo, hi, ok, c.min, c.max, rec.Body)
		}
	}
}
