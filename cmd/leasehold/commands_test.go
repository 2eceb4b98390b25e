package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/wire"
)

func writeJSONTest(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestClientCommands(t *testing.T) {
	var lastBody map[string]any
	var lastHeader http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastBody = nil
		data, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(data, &lastBody)
		lastHeader = r.Header.Clone()
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/leases":
			if lastBody["key"] == "busy" {
				writeJSONTest(w, 409, map[string]any{"error": map[string]any{"code": "LEASE_HELD", "message": `key "busy" is held`,
					"key": "busy", "holders": []any{map[string]any{"holder": "other", "lease_id": "ls_9", "remaining_ms": 2500}}}})
				return
			}
			writeJSONTest(w, 201, wire.Lease{LeaseID: "ls_1", Key: "jobs/1", Holder: "me", State: "active", FencingToken: 42,
				TTLMS: 5000, RemainingMS: 5000, Token: "secret-token"})
		case r.Method == "GET" && r.URL.Path == "/v1/leases/ls_1":
			writeJSONTest(w, 200, wire.Lease{LeaseID: "ls_1", Key: "jobs/1", State: "active", FencingToken: 42})
		case r.Method == "POST" && r.URL.Path == "/v1/validate":
			writeJSONTest(w, 200, wire.ValidateResult{Valid: false, Reason: "superseded"})
		case r.Method == "GET" && r.URL.Path == "/v1/leases":
			writeJSONTest(w, 200, wire.LeaseList{Leases: []*wire.Lease{{LeaseID: "ls_1", Key: "jobs/1", Holder: "me", State: "active", RemainingMS: 1200}}})
		default:
			writeJSONTest(w, 404, map[string]any{"error": map[string]any{"code": "NOT_FOUND", "message": "no route"}})
		}
	}))
	defer srv.Close()
	env := map[string]string{"LEASEHOLD_ADDR": srv.URL, "LEASEHOLD_TOKEN": "bearer"}

	t.Run("acquire prints the token", func(t *testing.T) {
		a, out, errb := testApp(env)
		err := a.run(context.Background(), []string{"acquire", "jobs/1", "--holder", "me", "--ttl", "5s", "--metadata", "a=b"})
		if err != nil {
			t.Fatalf("%v; stderr %s", err, errb)
		}
		for _, want := range []string{"ls_1", "fencing_token", "42", "secret-token"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if lastHeader.Get("Authorization") != "Bearer bearer" || lastBody["ttl_ms"] != float64(5000) ||
			lastBody["idempotency_key"] == nil || lastBody["metadata"].(map[string]any)["a"] != "b" {
			t.Errorf("request: %v %v", lastHeader, lastBody)
		}
	})
	t.Run("get shows no token", func(t *testing.T) {
		a, out, _ := testApp(env)
		if err := a.run(context.Background(), []string{"get", "ls_1", "--json"}); err != nil {
			t.Fatal(err)
		}
		var l wire.Lease
		if err := json.Unmarshal(out.Bytes(), &l); err != nil || l.FencingToken != 42 || l.Token != "" {
			t.Errorf("output %s (%v)", out, err)
		}
	})
	t.Run("error prints code and holders", func(t *testing.T) {
		a, _, errb := testApp(env)
		code := report(a.run(context.Background(), []string{"acquire", "busy"}), errb)
		if code != exitBusy {
			t.Errorf("exit %d", code)
		}
		lines := strings.Split(errb.String(), "\n")
		if lines[0] != `error: LEASE_HELD: key "busy" is held` || !strings.Contains(errb.String(), "held by other (lease ls_9, 2.5s left)") {
			t.Errorf("stderr %q", errb.String())
		}
	})
	t.Run("invalid validate exits 1", func(t *testing.T) {
		a, out, errb := testApp(env)
		code := report(a.run(context.Background(), []string{"validate", "--key", "k", "--fencing-token", "3"}), errb)
		if code != 1 || strings.TrimSpace(out.String()) != "invalid: superseded" || errb.Len() != 0 {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errb)
		}
	})
	t.Run("list table", func(t *testing.T) {
		a, out, _ := testApp(env)
		if err := a.run(context.Background(), []string{"list", "--prefix", "jobs/"}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "LEASE_ID") || !strings.Contains(out.String(), "1.2s") {
			t.Errorf("output %s", out)
		}
	})
	t.Run("unreachable node", func(t *testing.T) {
		a, _, errb := testApp(map[string]string{"LEASEHOLD_ADDR": "127.0.0.1:1"})
		code := report(a.run(context.Background(), []string{"get", "ls_1", "--timeout", "2s"}), errb)
		if code != exitUnavailable || !strings.HasPrefix(errb.String(), "error: ") {
			t.Errorf("exit %d, stderr %q", code, errb)
		}
	})
}

func TestTokenCreate(t *testing.T) {
	a, out, _ := testApp(nil)
	if err := a.run(context.Background(), []string{"token", "create", "--name", "ops", "--scopes", "read,admin", "--json"}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Token string          `json:"token"`
		Entry json.RawMessage `json:"entry"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Token) < 22 || strings.ContainsAny(got.Token, "+/=") {
		t.Errorf("token %q is not base64url of >= 16 bytes", got.Token)
	}
	if strings.Contains(string(got.Entry), got.Token) {
		t.Error("the entry contains the token itself")
	}
	// The entry is what a tokens file holds, and it matches the token.
	if _, err := api.ParseTokens([]byte(`{"tokens": [` + string(got.Entry) + `]}`)); err != nil {
		t.Fatalf("tokens file rejects the entry: %v", err)
	}
	var e tokenEntry
	_ = json.Unmarshal(got.Entry, &e)
	if e.SHA256 != api.HashToken(got.Token) || e.Name != "ops" || strings.Join(e.Scopes, ",") != "read,admin" {
		t.Errorf("entry %+v", e)
	}

	// The readable form prints the token once and the entry line.
	a, out, _ = testApp(nil)
	if err := a.run(context.Background(), []string{"token", "create", "--name", "ci"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"name":"ci"`) || strings.Count(out.String(), "token: ") != 1 {
		t.Errorf("output %s", out)
	}

	// A scoped token: its entry carries the restrictions, as the tokens
	// file reads them.
	a, out, _ = testApp(nil)
	if err := a.run(context.Background(), []string{"token", "create", "--name", "tenant-a", "--scopes", "write", "--json",
		"--write-prefix", "tenant-a/", "--read-prefix", "shared/", "--read-prefix", "", "--holder", "gw-a", "--holder-prefix", "tenant-a/"}); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	var scoped tokenEntry
	if err := json.Unmarshal(got.Entry, &scoped); err != nil {
		t.Fatal(err)
	}
	if k, h := scoped.Keys, scoped.Holders; k == nil || h == nil || fmt.Sprintf("%q %q %q %q", k.Read, k.Write, h.Names, h.Prefixes) !=
		`["shared/" ""] ["tenant-a/"] ["gw-a"] ["tenant-a/"]` {
		t.Errorf("entry %s", got.Entry)
	}
	if _, err := api.ParseTokens([]byte(`{"tokens": [` + string(got.Entry) + `]}`)); err != nil {
		t.Fatalf("tokens file rejects the entry: %v", err)
	}
}

func TestPrintEvent(t *testing.T) {
	var b strings.Builder
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	err := printEvent(&b, wire.Event{ID: "7-0", Type: "acquired", Time: ts, Previous: "ls_0",
		Lease: &wire.Lease{LeaseID: "ls_1", Key: "k", Holder: "h", FencingToken: 7, State: "active", RemainingMS: 1000, Token: "never"}})
	if err != nil {
		t.Fatal(err)
	}
	line := b.String()
	for _, want := range []string{"7-0", "acquired", "key=k", "lease=ls_1", "holder=h", "fencing=7", "previous=ls_0"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "never") || strings.Count(line, "\n") != 1 {
		t.Errorf("line %q", line)
	}
}

// TestDataMigrateLogUsage: data migrate-log needs --data-dir and a --to
// of boltdb or wal (usage errors, exit 2), and says so for a directory
// that is not a data dir.
func TestDataMigrateLogUsage(t *testing.T) {
	for _, args := range [][]string{{"data"}, {"data", "move"}, {"data", "migrate-log", "--to", "wal"},
		{"data", "migrate-log", "--data-dir", "x", "--to", "rocks"}, {"data", "migrate-log", "--data-dir", "x"},
		{"data", "recover"}, {"data", "recover", "--data-dir", "x", "y"}, {"data", "export-snapshot", "--data-dir", "x"}} {
		a, _, errb := testApp(nil)
		if code := report(a.run(context.Background(), args), errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb)
		}
	}
	a, _, errb := testApp(nil)
	dir := t.TempDir()
	if code := report(a.run(context.Background(), []string{"data", "migrate-log", "--data-dir", dir, "--to", "wal"}), errb); code != 1 ||
		!strings.Contains(errb.String(), "not a data dir") {
		t.Errorf("an empty directory: exit %d, %s", code, errb)
	}
}
