package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/api"
)

// cliResult is one run of the leasehold binary.
type cliResult struct {
	stdout, stderr string
	status         int
}

// runBinary runs the binary with args and returns its output and exit
// status (failing the test only if it could not run at all).
func runBinary(t *testing.T, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(buildBinary(t), args...)
	cmd.Env = append(os.Environ(), "LEASEHOLD_ADDR=", "LEASEHOLD_TOKEN=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %v: %v", args, err)
	}
	return cliResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
}

// jsonError decodes the --json error object from stderr.
func jsonError(t *testing.T, r cliResult) (code string, status int, raw map[string]any) {
	t.Helper()
	var v struct {
		Error map[string]any `json:"error"`
	}
	if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || json.Unmarshal([]byte(r.stderr), &v) != nil || v.Error == nil {
		t.Fatalf("stderr is not one JSON error object: %q", r.stderr)
	}
	c, _ := v.Error["code"].(string)
	s, _ := v.Error["exit_status"].(float64)
	return c, int(s), v.Error
}

// TestProcessExitCodes runs the binary against a real server with
// authentication on and checks the exit status of each error class, with
// and without --json, with the client flags before and after the command.
func TestProcessExitCodes(t *testing.T) {
	dir := t.TempDir()
	rwToken, roToken, t2Token := "rw-"+randomID(16), "ro-"+randomID(16), "t2-"+randomID(16)
	tokens := map[string]any{"tokens": []any{
		tokenEntry{Name: "rw", SHA256: api.HashToken(rwToken), Scopes: []string{"read", "write", "admin"}},
		tokenEntry{Name: "ro", SHA256: api.HashToken(roToken), Scopes: []string{"read"}},
		// A tenant's token, scoped to its keys and holders.
		tokenEntry{Name: "t2", SHA256: api.HashToken(t2Token), Scopes: []string{"write"},
			Keys: &tokenKeys{Write: []string{"t2/"}}, Holders: &tokenHolders{Prefixes: []string{"t2-"}}},
	}}
	data, _ := json.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokensFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--tokens-file", tokensFile)
	s.start()
	addr := s.http

	// Success, client flags before the command.
	r := runBinary(t, "--addr", addr, "--token", rwToken, "--json", "acquire", "cli/k", "--holder", "a", "--ttl", "30s")
	var l struct {
		LeaseID      string `json:"lease_id"`
		FencingToken uint64 `json:"fencing_token"`
	}
	if r.status != exitOK || json.Unmarshal([]byte(r.stdout), &l) != nil || l.LeaseID == "" {
		t.Fatalf("acquire: %+v", r)
	}
	// The same flags after the command, and mixed.
	if r := runBinary(t, "get", l.LeaseID, "--addr", addr, "--token", rwToken); r.status != exitOK || !strings.Contains(r.stdout, l.LeaseID) {
		t.Fatalf("get, flags after: %+v", r)
	}
	if r := runBinary(t, "--addr", addr, "get", "--token", rwToken, l.LeaseID); r.status != exitOK || !strings.Contains(r.stdout, l.LeaseID) {
		t.Fatalf("get, flags both sides: %+v", r)
	}

	cases := []struct {
		name   string
		args   []string
		status int
		code   string
		text   string // in the readable stderr and the JSON message (unless it names the code)
	}{
		{"held", []string{"--token", rwToken, "acquire", "cli/k", "--holder", "b"}, exitBusy, "LEASE_HELD", `"cli/k" is held`},
		{"not found", []string{"--token", rwToken, "get", "ls_nope"}, exitNotFound, "LEASE_NOT_FOUND", "not found"},
		{"ended", []string{"--token", rwToken, "renew", l.LeaseID, "--lease-token", "wrong"}, exitDenied, "LEASE_TOKEN_INVALID", "LEASE_TOKEN_INVALID"},
		{"ttl above max", []string{"--token", rwToken, "acquire", "cli/x", "--ttl", "25h"}, exitUsage, "INVALID_ARGUMENT", "ttl 25h exceeds the maximum 24h"},
		{"ttl below min", []string{"--token", rwToken, "acquire", "cli/x", "--ttl=500ms"}, exitUsage, "INVALID_ARGUMENT", "ttl 500ms is below the minimum 1s"},
		{"wait above max", []string{"--token", rwToken, "acquire", "cli/x", "--wait", "2h"}, exitUsage, "INVALID_ARGUMENT", "wait 2h exceeds the maximum 5m"},
		{"session ttl", []string{"--token", rwToken, "session", "create", "--ttl", "48h"}, exitUsage, "INVALID_ARGUMENT", "ttl 48h exceeds the maximum 24h"},
		{"no token", []string{"get", l.LeaseID}, exitDenied, "UNAUTHENTICATED", "UNAUTHENTICATED"},
		{"read-only token writes", []string{"--token", roToken, "acquire", "cli/y"}, exitDenied, "PERMISSION_DENIED", "PERMISSION_DENIED"},
		{"another tenant's lease", []string{"--token", t2Token, "get", l.LeaseID}, exitNotFound, "LEASE_NOT_FOUND", "not found"},
		{"scoped token outside its keys", []string{"--token", t2Token, "acquire", "cli/z", "--holder", "t2-a"}, exitDenied, "PERMISSION_DENIED", `may not write key "cli/z"`},
		{"scoped token releases another holder", []string{"--token", t2Token, "holder-release", "a"}, exitDenied, "PERMISSION_DENIED", `may not act as holder "a"`},
		{"bad flag", []string{"get", "--nope", "x"}, exitUsage, "USAGE", "flag provided but not defined"},
		{"mistyped command", []string{"aquire", "k"}, exitUsage, "USAGE", `did you mean "acquire"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--addr", addr}, tc.args...)
			r := runBinary(t, args...)
			// (A bad flag is explained by the flag package, with the usage.)
			if r.status != tc.status || !strings.Contains(r.stderr, tc.text) || (tc.name != "bad flag" && !strings.HasPrefix(r.stderr, "error: ")) {
				t.Errorf("%v: exit %d (want %d), stderr %q (want %q)", tc.args, r.status, tc.status, r.stderr, tc.text)
			}
			r = runBinary(t, append(args, "--json")...)
			code, st, obj := jsonError(t, r)
			if r.status != tc.status || st != tc.status || code != tc.code || r.stdout != "" {
				t.Errorf("%v --json: exit %d, object %v, stdout %q", tc.args, r.status, obj, r.stdout)
			}
			if msg, _ := obj["message"].(string); !strings.Contains(msg, tc.text) && !strings.Contains(tc.text, tc.code) {
				t.Errorf("--json message %q lacks %q", msg, tc.text)
			}
		})
	}

	// The tenant takes its own key and releases its own holder, no admin.
	if r := runBinary(t, "--addr", addr, "--token", t2Token, "acquire", "t2/k", "--holder", "t2-a"); r.status != exitOK {
		t.Fatalf("scoped acquire: %+v", r)
	}
	if r := runBinary(t, "--addr", addr, "--token", t2Token, "holder-release", "t2-a"); r.status != exitOK || !strings.Contains(r.stdout, "released 1") {
		t.Fatalf("scoped holder release: %+v", r)
	}

	// The holders of a LEASE_HELD come with the JSON error.
	r = runBinary(t, "--addr", addr, "--token", rwToken, "--json", "acquire", "cli/k", "--holder", "b")
	if _, _, obj := jsonError(t, r); obj["key"] != "cli/k" || !strings.Contains(r.stderr, `"holder":"a"`) {
		t.Errorf("LEASE_HELD object %s", r.stderr)
	}

	// Unreachable: nothing listens on a closed port.
	closed := freePort(t)
	r = runBinary(t, "--addr", closed, "--timeout", "5s", "get", "ls_1")
	if r.status != exitUnavailable {
		t.Errorf("unreachable: exit %d, stderr %q", r.status, r.stderr)
	}
	if code, st, _ := jsonError(t, runBinary(t, "--json", "--addr", closed, "get", "ls_1")); code != "UNAVAILABLE" || st != exitUnavailable {
		t.Errorf("unreachable --json: %s %d", code, st)
	}
}
