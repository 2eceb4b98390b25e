package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProcessJSONLogsAndRequestID: a real server with --log-format json
// logs Raft's lines with their fields as JSON fields (not text in msg),
// echoes a client's X-Request-Id, and logs the request's lines with it.
func TestProcessJSONLogsAndRequestID(t *testing.T) {
	t.Parallel()
	const token = "logs-token-0123456789abcdef"
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	writeTokens(t, tokens, false, token)
	s := newServer(t, "--tokens-file", tokens, "--log-format", "json")
	s.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- server log ----\n%s", tail(s.log(), 16<<10))
		}
	})

	// An admin request (logged with the token's name) with an id.
	req, err := http.NewRequest("GET", "http://"+s.http+"/v1/cluster/local", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Request-Id", "e2e-req-7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "e2e-req-7" {
		t.Fatalf("admin request: %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	// A request without one gets one.
	resp, err = http.Get("http://" + s.http + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if id := resp.Header.Get("X-Request-Id"); !validRequestIDForTest(id) {
		t.Fatalf("no request id made: %q", id)
	}

	eventuallyMsg(t, 20*time.Second, func() (bool, string) {
		var admin, raftFields bool
		for _, line := range strings.Split(s.log(), "\n") {
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				return false, "a log line is not JSON: " + line
			}
			if m["msg"] == "admin request" && m["request_id"] == "e2e-req-7" && m["token_name"] == "t0" {
				admin = true
			}
			if m["component"] == "raft" {
				if msg, _ := m["msg"].(string); strings.HasPrefix(msg, "[") || strings.Contains(msg, "=") {
					return false, "a raft line with its fields in msg: " + line
				}
				if len(m) > 4 { // time, level, msg, component and more
					raftFields = true
				}
			}
		}
		return admin && raftFields, "want the admin request's line with request_id e2e-req-7 and a raft line with fields of its own"
	})
}

func validRequestIDForTest(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, " \t\r\n")
}
