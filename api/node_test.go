package api

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestRealNode runs a few requests against an in-memory single node: real
// errors must come out with the contract's statuses and details.
func TestRealNode(t *testing.T) {
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

	rec := do(t, h, "POST", "/v1/leases", `{"key":"jobs/1","holder":"w1","ttl_ms":30000}`)
	if rec.Code != 201 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	var l wire.Lease
	jsonOf(t, rec, &l)
	if l.Token == "" || l.FencingToken == 0 || l.State != "active" {
		t.Fatalf("lease = %+v", l)
	}
	if rec.Header().Get(headerIndex) == "0" {
		t.Error("index header is 0 after a write")
	}

	rec = do(t, h, "POST", "/v1/leases", `{"key":"jobs/1","holder":"w2","ttl_ms":30000}`)
	e := wantError(t, rec, 409, wire.CodeLeaseHeld, "")
	if e.Key != "jobs/1" || len(e.Holders) != 1 || e.Holders[0].Holder != "w1" || e.Holders[0].LeaseID != l.LeaseID {
		t.Errorf("LEASE_HELD details = %+v", e)
	}
	if strings.Contains(rec.Body.String(), l.Token) {
		t.Error("LEASE_HELD carries the holder's token")
	}

	wantError(t, do(t, h, "POST", "/v1/leases", `{"key":"","holder":"w1","ttl_ms":30000}`), 400, wire.CodeInvalidArgument, "key")
	wantError(t, do(t, h, "POST", "/v1/leases/"+l.LeaseID+"/renew", "", "X-Lease-Token", "wrong"), 403, wire.CodeLeaseTokenInvalid, "")
	wantError(t, do(t, h, "GET", "/v1/leases/ls_00000000", ""), 404, wire.CodeLeaseNotFound, "")

	rec = do(t, h, "DELETE", "/v1/leases/"+l.LeaseID, `{"reason":"done"}`, "X-Lease-Token", l.Token)
	if rec.Code != 200 {
		t.Fatalf("release: %d %s", rec.Code, rec.Body)
	}
	rec = do(t, h, "GET", "/v1/leases/"+l.LeaseID, "")
	var got wire.Lease
	jsonOf(t, rec, &got)
	if got.State != "released" || got.EndReason != "done" || got.Token != "" {
		t.Errorf("after release = %+v", got)
	}

	rec = do(t, h, "GET", "/metrics", "")
	if s := parseExposition(t, rec.Body.String()); s["leasehold_leases_acquired_total"] < 1 {
		t.Errorf("acquired_total = %v", s["leasehold_leases_acquired_total"])
	}

	// The event stream replays the history: acquired, then released.
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, cancel := openStream(t, srv, "/v1/events?from=start&key=jobs/1")
	defer cancel()
	br := bufio.NewReader(resp.Body)
	var types []string
	for len(types) < 2 {
		m, err := readSSE(t, br)
		if err != nil {
			t.Fatalf("stream: %v (got %v)", err, types)
		}
		if m.comment {
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal([]byte(m.data), &ev); err != nil || ev.ID != m.id || ev.Type != m.event {
			t.Fatalf("message %+v: %v", m, err)
		}
		if ev.Lease != nil && ev.Lease.Token != "" {
			t.Error("event carries a token")
		}
		types = append(types, m.event)
	}
	if strings.Join(types, " ") != "acquired released" {
		t.Errorf("events = %v", types)
	}
}
