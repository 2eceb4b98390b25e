package api

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/node"
)

// followerFake is a fake node that is a follower of the given leader.
type followerFake struct {
	*fakeNode
	lmu    sync.Mutex
	leader node.LeaderInfo
	known  bool
}

func (f *followerFake) Leader() (node.LeaderInfo, bool) {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	return f.leader, f.known
}

// setLeader makes another node the leader (an election).
func (f *followerFake) setLeader(l node.LeaderInfo, known bool) {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	f.leader, f.known = l, known
}
func (f *followerFake) NodeID() string { return "f1" }

func TestFollowerForwardsToLeader(t *testing.T) {
	leaderNode := newFake()
	leaderNode.index.Store(777)
	var seenForwarded string
	leaderAPI := New(leaderNode, Options{})
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenForwarded = r.Header.Get(headerForwarded)
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	local := newFake()
	f := &followerFake{fakeNode: local, leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(f, Options{})

	// A write goes to the leader; its answer (and index) comes back.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)))
	if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"lease-secret"`) {
		t.Fatalf("forwarded acquire: %d %s", rec.Code, rec.Body)
	}
	if got := rec.Header().Get(headerIndex); got != "777" {
		t.Fatalf("index header %q, want the leader's 777", got)
	}
	leaderNode.only(t, "Acquire")
	if len(local.called()) != 0 || seenForwarded != "f1" {
		t.Fatalf("follower handled it itself (%v) or did not mark it (%q)", local.called(), seenForwarded)
	}

	// A linearizable read goes too; a stale one and the event stream's
	// health routes stay local.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/leases/ls_9", nil))
	if rec.Code != 200 || len(leaderNode.called()) != 2 {
		t.Fatalf("linearizable read: %d, leader calls %v", rec.Code, leaderNode.called())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/leases/ls_9?stale=true", nil))
	if rec.Code != 200 || len(local.called()) != 1 || rec.Header().Get(headerIndex) != "42" {
		t.Fatalf("stale read: %d, local calls %v, index %q", rec.Code, local.called(), rec.Header().Get(headerIndex))
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 || len(leaderNode.called()) != 2 {
		t.Fatalf("readyz forwarded or failed: %d", rec.Code)
	}

	// A request that was already forwarded is never forwarded again.
	req := httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`))
	req.Header.Set(headerForwarded, "f2")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if len(local.called()) != 2 || len(leaderNode.called()) != 2 {
		t.Fatalf("re-forwarded: local %v", local.called())
	}
}

func TestForwardToUnreachableLeader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	local := newFake()
	h := New(&followerFake{fakeNode: local, leader: node.LeaderInfo{ID: "l1", HTTPAddr: dead}, known: true}, Options{})
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/leases/ls_1", ""},
		{"POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":5000}`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
		// Nothing reached the leader: NO_LEADER, retryable.
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "NO_LEADER") || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("%s %s: %d %s", tc.method, tc.path, rec.Code, rec.Body)
		}
	}
	if len(local.called()) != 0 {
		t.Fatalf("follower applied locally: %v", local.called())
	}

	// No leader known: the node answers itself (a real follower says
	// NO_LEADER).
	h = New(&followerFake{fakeNode: local}, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/leases/ls_1", nil))
	if rec.Code != 200 || len(local.called()) != 1 {
		t.Fatalf("no leader known: %d %v", rec.Code, local.called())
	}
}

func TestForwardWriteCutMidFlightIsIndeterminate(t *testing.T) {
	// The leader takes the request and drops the connection without an
	// answer: the write may have been applied.
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj, _ := w.(http.Hijacker)
		c, _, _ := hj.Hijack()
		c.Close()
	}))
	defer leader.Close()
	h := New(&followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`)))
	if rec.Code != http.StatusGatewayTimeout || !strings.Contains(rec.Body.String(), "INDETERMINATE") {
		t.Fatalf("cut write: %d %s", rec.Code, rec.Body)
	}
}
