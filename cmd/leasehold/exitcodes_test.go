package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

func TestSuggest(t *testing.T) {
	cmds := []string{"acquire", "renew", "release", "revoke", "get", "list", "session", "cluster", "hold", "version", "help"}
	for in, want := range map[string]string{
		"aquire":                  "acquire",
		"acquier":                 "acquire",
		"lsit":                    "list",
		"sesion":                  "session",
		"sess":                    "session",
		"clust":                   "cluster",
		"verison":                 "version",
		"gte":                     "get",
		"nope":                    "",
		"x":                       "",
		"re":                      "", // a prefix of three commands
		"snapshotting-everything": "",
	} {
		if got := suggest(in, cmds); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
	if d := editDistance("kitten", "sitting"); d != 3 {
		t.Errorf("editDistance = %d", d)
	}
}

func TestGlobalFlags(t *testing.T) {
	set, rest, err := globalFlags([]string{"--addr", "h:1", "-json", "--token=t", "--addr", "h:2", "get", "--stale", "x"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range set {
		got[kv[0]] = kv[1]
	}
	if got["addr"] != "h:2" || got["json"] != "true" || got["token"] != "t" || len(set) != 3 {
		t.Errorf("set %v", set)
	}
	if strings.Join(rest, " ") != "get --stale x" {
		t.Errorf("rest %q", rest)
	}
	if _, _, err := globalFlags([]string{"--stale", "get", "x"}); err == nil || !strings.Contains(err.Error(), "--addr") {
		t.Errorf("a subcommand's own flag before it: %v", err)
	}
}

// TestClientFlagsBeforeCommand: flags given before the command apply to it
// and lose to the same flag after it; the environment loses to both.
func TestClientFlagsBeforeCommand(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Get("Authorization"))
		writeJSONTest(w, 200, wire.Lease{LeaseID: "ls_1", Key: "k", State: "active", FencingToken: 7})
	}))
	defer srv.Close()
	env := map[string]string{"LEASEHOLD_ADDR": "127.0.0.1:1", "LEASEHOLD_TOKEN": "from-env"}
	a, out, errb := testApp(env)
	if err := a.run(context.Background(), []string{"--addr", srv.URL, "--token", "before", "--json", "get", "ls_1"}); err != nil {
		t.Fatalf("%v; %s", err, errb)
	}
	var l wire.Lease
	if json.Unmarshal(out.Bytes(), &l) != nil || l.FencingToken != 7 || seen[0] != "Bearer before" {
		t.Errorf("stdout %s, auth %v", out, seen)
	}
	a, _, errb = testApp(env)
	if err := a.run(context.Background(), []string{"--addr", srv.URL, "--token", "before", "get", "ls_1", "--token", "after"}); err != nil {
		t.Fatalf("%v; %s", err, errb)
	}
	if seen[1] != "Bearer after" {
		t.Errorf("auth %v", seen)
	}
	a, _, errb = testApp(env)
	if code := report(a.run(context.Background(), []string{"--addr", srv.URL, "token", "create", "--name", "x"}), errb); code != exitUsage ||
		!strings.Contains(errb.String(), "--addr (given before the command) does not apply") {
		t.Errorf("exit %d, stderr %q", code, errb)
	}
}

// TestExitStatusPerCode: every contract error code a server may answer has
// its documented exit status, readable and under --json.
func TestExitStatusPerCode(t *testing.T) {
	var code wire.Code
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := 409
		switch code {
		case wire.CodeNoLeader:
			status = 503
		case wire.CodeIndeterminate:
			status = 504
		case wire.CodeLeaseNotFound:
			status = 404
		case wire.CodeUnauthenticated:
			status = 401
		case wire.CodeInternal:
			status = 500
		}
		writeJSONTest(w, status, map[string]any{"error": map[string]any{"code": code, "message": "m"}})
	}))
	defer srv.Close()
	for c, want := range map[wire.Code]int{
		wire.CodeNoLeader:        exitUnavailable,
		wire.CodeIndeterminate:   exitUnavailable,
		wire.CodeLeaseHeld:       exitBusy,
		wire.CodeLockDelay:       exitBusy,
		wire.CodeLeaseNotFound:   exitNotFound,
		wire.CodeLeaseExpired:    exitNotFound,
		wire.CodeUnauthenticated: exitDenied,
		wire.CodeInternal:        exitFailure,
	} {
		code = c
		for _, asJSON := range []bool{false, true} {
			args := []string{"--addr", srv.URL, "--timeout", "5s", "get", "ls_1"}
			if asJSON {
				args = append(args, "--json")
			}
			a, _, errb := testApp(nil)
			got := report(a.run(context.Background(), args), errb)
			if got != want {
				t.Errorf("%s (json %v): exit %d, want %d; stderr %q", c, asJSON, got, want, errb)
			}
			if asJSON && !strings.Contains(errb.String(), `"code":"`+string(c)+`"`) {
				t.Errorf("%s --json: stderr %q", c, errb)
			}
		}
	}
}

func TestInUserUnits(t *testing.T) {
	// The bounds come from the error's min and max, not its message.
	ttl := wire.OutOfRange("ttl_ms", 1000, 86400000, 90000000, "")
	ttl.Message = "whatever the server says"
	got := inUserUnits(ttl, []string{"acquire", "k", "--ttl", "25h"}).(*wire.Error)
	if got.Message != "ttl 25h exceeds the maximum 24h" || got.Field != "ttl_ms" {
		t.Errorf("got %+v", got)
	}
	if got := inUserUnits(ttl, []string{"acquire", "k", "--ttl=500ms"}).(*wire.Error); got.Message != "ttl 500ms is below the minimum 1s" {
		t.Errorf("got %q", got.Message)
	}
	// Not on the command line (a default, say): the range.
	if got := inUserUnits(ttl, nil).(*wire.Error); got.Message != "ttl must be 1s-24h" {
		t.Errorf("got %q", got.Message)
	}
	ld := wire.OutOfRange("lock_delay_ms", 0, 60000, 90000, "")
	if got := inUserUnits(ld, []string{"--lock-delay=1m30s"}).(*wire.Error); got.Message != "lock-delay 1m30s exceeds the maximum 1m" {
		t.Errorf("got %q", got.Message)
	}
	// An INVALID_ARGUMENT without bounds passes unchanged.
	noBounds := &wire.Error{Code: wire.CodeInvalidArgument, Field: "ttl_ms", Message: "ttl_ms must be 1000-86400000, got 90000000"}
	if inUserUnits(noBounds, nil) != error(noBounds) {
		t.Error("an error without bounds must pass unchanged")
	}
	other := &wire.Error{Code: wire.CodeInvalidArgument, Field: "key", Message: "bad"}
	if inUserUnits(other, nil) != error(other) {
		t.Error("other errors must pass unchanged")
	}
	for d, want := range map[string]string{"24h0m0s": "24h", "1h30m0s": "1h30m", "5m0s": "5m", "1.5s": "1.5s", "500ms": "500ms", "2m30s": "2m30s"} {
		dd, _ := time.ParseDuration(d)
		if got := shortDuration(dd); got != want {
			t.Errorf("shortDuration(%s) = %s, want %s", d, got, want)
		}
	}
}

// TestLocalErrorsAreNotUnreachable: a file error is a plain failure (1), not
// "unreachable" (5), though its errno looks like a net.Error.
func TestLocalErrorsAreNotUnreachable(t *testing.T) {
	_, err := os.Open(filepath.Join(t.TempDir(), "missing"))
	if f := classify(err); f.status != exitFailure {
		t.Errorf("missing file: exit %d", f.status)
	}
	if f := classify(fmt.Errorf("get: %w", context.DeadlineExceeded)); f.status != exitUnavailable {
		t.Errorf("deadline: exit %d", f.status)
	}
}
