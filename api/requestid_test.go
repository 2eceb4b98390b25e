package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
)

// logBuffer collects JSON log lines from a logger while a test reads them.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestRequestID: a client's usable X-Request-Id is echoed, anything else
// is replaced by a fresh id, and every answer has exactly one; the log
// lines of a request carry it.
func TestRequestID(t *testing.T) {
	uncheckedExchanges(t) // the fake answers 500 on purpose, to log an error line
	var logs logBuffer
	f := newFake()
	h := New(f, Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	do := func(id string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/leases/ls_1", nil)
		if id != "" {
			req.Header.Set(headerRequestID, id)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if n := len(rec.Header().Values(headerRequestID)); n != 1 {
			t.Fatalf("answer has %d X-Request-Id headers", n)
		}
		return rec
	}
	if got := do("job-42/step:7").Header().Get(headerRequestID); got != "job-42/step:7" {
		t.Fatalf("a client's id came back as %q", got)
	}
	seen := map[string]bool{}
	for _, bad := range []string{"", "has space", "tab\tin", "ünïcode", strings.Repeat("x", maxRequestIDLen+1)} {
		got := do(bad).Header().Get(headerRequestID)
		if got == bad || !validRequestID(got) || seen[got] {
			t.Fatalf("id %q answered with %q (want a fresh valid one)", bad, got)
		}
		seen[got] = true
	}
	if got := do(strings.Repeat("y", maxRequestIDLen)).Header().Get(headerRequestID); got != strings.Repeat("y", maxRequestIDLen) {
		t.Fatalf("an id of the maximum length was replaced: %q", got)
	}

	// A failing request: its log line names it.
	f.err = errors.New("disk on fire")
	rec := do("trace-me")
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("failing request answered %d", rec.Code)
	}
	var found bool
	for _, r := range logs.records(t) {
		if r["msg"] == "request failed" {
			found = true
			if r["request_id"] != "trace-me" {
				t.Fatalf("log line without the request's id: %v", r)
			}
		}
	}
	if !found {
		t.Fatal("no log line for the failed request")
	}
}

// TestRequestIDForwarded: a follower passes the request id to the leader,
// whose log lines and answer carry the same id; the client gets it once.
func TestRequestIDForwarded(t *testing.T) {
	uncheckedExchanges(t) // the fake leader answers 500 on purpose
	var leaderLogs logBuffer
	leaderNode := newFake()
	leaderNode.err = errors.New("leader trouble")
	leaderAPI := New(leaderNode, Options{Logger: slog.New(slog.NewJSONHandler(&leaderLogs, nil))})
	var mu sync.Mutex
	var atLeader []string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		atLeader = append(atLeader, r.Header.Get(headerRequestID))
		mu.Unlock()
		leaderAPI.ServeHTTP(w, r)
	}))
	defer leader.Close()
	fol := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: strings.TrimPrefix(leader.URL, "http://")}, known: true}
	h := New(fol, Options{})

	for _, sent := range []string{"fwd-1", ""} {
		req := httptest.NewRequest("POST", "/v1/leases", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`))
		if sent != "" {
			req.Header.Set(headerRequestID, sent)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		ids := rec.Header().Values(headerRequestID)
		mu.Lock()
		last := atLeader[len(atLeader)-1]
		mu.Unlock()
		if len(ids) != 1 || (sent != "" && ids[0] != sent) || last != ids[0] {
			t.Fatalf("sent %q: answer ids %q, the leader saw %q", sent, ids, last)
		}
		var logged bool
		for _, r := range leaderLogs.records(t) {
			if r["msg"] == "request failed" && r["request_id"] == ids[0] {
				logged = true
			}
		}
		if !logged {
			t.Fatalf("the leader's log has no line with request_id %q", ids[0])
		}
	}
}

// TestDateHeader: every answer carries one Date header, of the current
// second in HTTP's format, as net/http would have written it.
func TestDateHeader(t *testing.T) {
	srv := httptest.NewServer(New(newFake(), Options{}))
	defer srv.Close()
	for i := 0; i < 3; i++ {
		before := time.Now().Truncate(time.Second)
		res, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		after := time.Now()
		if v := res.Header.Values("Date"); len(v) != 1 {
			t.Fatalf("Date headers: %q, want one", v)
		}
		at, err := http.ParseTime(res.Header.Get("Date"))
		if err != nil || res.Header.Get("Date") != at.UTC().Format(http.TimeFormat) {
			t.Fatalf("Date %q: not HTTP's format (%v)", res.Header.Get("Date"), err)
		}
		if at.Before(before) || at.After(after) {
			t.Fatalf("Date %v, want between %v and %v", at, before, after)
		}
	}
}
