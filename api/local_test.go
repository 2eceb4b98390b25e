package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

func TestLocalState(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	rec := do(t, h, "GET", "/v1/cluster/local", "")
	var st node.LocalState
	jsonOf(t, rec, &st)
	if rec.Code != 200 || st.NodeID != "n1" || st.AppliedIndex != 42 || st.StateHash != "" {
		t.Fatalf("local state: %d %s", rec.Code, rec.Body)
	}
	c := f.only(t, "LocalState")
	if c.args[0].(uint64) != 0 {
		t.Fatalf("asked for a hash at %v without hash_at", c.args[0])
	}
	if left := c.args[1].(time.Duration); left <= 5*time.Second || left > 10*time.Second { // however long a loaded machine took to call
		t.Fatalf("default timeout left %v, want about 10s", left)
	}

	f = newFake()
	rec = do(t, New(f, Options{}), "GET", "/v1/cluster/local?hash_at=1234&timeout_ms=1500", "")
	st = node.LocalState{}
	jsonOf(t, rec, &st)
	if rec.Code != 200 || st.HashIndex != 1234 || len(st.StateHash) != 64 || !strings.Contains(rec.Body.String(), `"state_hash":"abab`) {
		t.Fatalf("hash: %d %s", rec.Code, rec.Body)
	}
	c = f.only(t, "LocalState")
	if c.args[0].(uint64) != 1234 {
		t.Fatalf("hash_at passed as %v", c.args[0])
	}
	if left := c.args[1].(time.Duration); left <= 0 || left > 1500*time.Millisecond {
		t.Fatalf("timeout_ms=1500 left %v", left)
	}
}

func TestLocalStateBadInput(t *testing.T) {
	for _, tt := range []struct{ query, field string }{
		{"hash_at=0", "hash_at"},
		{"hash_at=-1", "hash_at"},
		{"hash_at=x", "hash_at"},
		{"hash_at=18446744073709551616", "hash_at"},
		{"timeout_ms=0", "timeout_ms"},
		{"timeout_ms=60001", "timeout_ms"},
		{"hash_at=5&timeout_ms=1.5", "timeout_ms"},
	} {
		f := newFake()
		rec := do(t, New(f, Options{}), "GET", "/v1/cluster/local?"+tt.query, "")
		wantError(t, rec, 400, wire.CodeInvalidArgument, tt.field)
		if cs := f.called(); len(cs) != 0 {
			t.Fatalf("%s reached the node: %v", tt.query, cs)
		}
	}
}

// TestLocalStatePassed: a hash asked for at an index the node is past is
// 409 INDEX_PASSED with the applied index; a timeout is 503.
func TestLocalStatePassed(t *testing.T) {
	f := newFake()
	f.err = &wire.Error{Code: wire.CodeIndexPassed, Message: "past", AppliedIndex: 99}
	rec := do(t, New(f, Options{}), "GET", "/v1/cluster/local?hash_at=5", "")
	if e := wantError(t, rec, http.StatusConflict, wire.CodeIndexPassed, ""); e.AppliedIndex != 99 {
		t.Fatalf("applied index %d, want 99", e.AppliedIndex)
	}
	f.err = &wire.Error{Code: wire.CodeUnavailable, Message: "not in time", AppliedIndex: 7}
	rec = do(t, New(f, Options{}), "GET", "/v1/cluster/local?hash_at=500", "")
	wantError(t, rec, http.StatusServiceUnavailable, wire.CodeUnavailable, "")
}

// TestLocalStateNeverForwarded: a follower that knows the leader still
// answers GET /v1/cluster/local itself.
func TestLocalStateNeverForwarded(t *testing.T) {
	leaderNode := newFake()
	leader := httptest.NewServer(New(leaderNode, Options{}))
	defer leader.Close()
	local := newFake()
	f := &followerFake{fakeNode: local, leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	rec := do(t, New(f, Options{}), "GET", "/v1/cluster/local?hash_at=3", "")
	if rec.Code != 200 {
		t.Fatalf("status %d %s", rec.Code, rec.Body)
	}
	local.only(t, "LocalState")
	if cs := leaderNode.called(); len(cs) != 0 {
		t.Fatalf("forwarded to the leader: %v", cs)
	}
}
