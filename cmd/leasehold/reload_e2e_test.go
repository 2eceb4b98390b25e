package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
)

// writeTokens writes a tokens file granting admin to each token (named
// after its position), through a temporary file and a rename unless
// inPlace.
func writeTokens(t *testing.T, path string, inPlace bool, tokens ...string) {
	t.Helper()
	var parts []string
	for i, tok := range tokens {
		parts = append(parts, fmt.Sprintf(`{"name":"t%d","sha256":%q,"scopes":["admin"]}`, i, api.HashToken(tok)))
	}
	writeFileAs(t, path, inPlace, `{"tokens":[`+strings.Join(parts, ",")+`]}`)
}

func writeFileAs(t *testing.T, path string, inPlace bool, content string) {
	t.Helper()
	if inPlace {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// authStatus is the status code of an authenticated read on s.
func authStatus(t *testing.T, s *server, token string) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+s.http+"/v1/leases", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metricNum is one sample of s's /metrics (-1: absent).
func metricNum(t *testing.T, s *server, series string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(metricValue(t, s, series), 64)
	if err != nil {
		return -1
	}
	return v
}

// TestProcessTokensReload: a running server takes a changed tokens file on
// SIGHUP (with polling off, so only the signal can tell), and, with
// polling on, when the file is just rewritten; a broken file keeps the
// tokens it had, is logged and counted.
func TestProcessTokensReload(t *testing.T) {
	t.Parallel()
	const old, added = "old-token-0123456789abcdef", "new-token-0123456789abcdef"
	wantStatus := func(s *server, tok string, want int) {
		t.Helper()
		eventuallyMsg(t, 20*time.Second, func() (bool, string) {
			got := authStatus(t, s, tok)
			return got == want, fmt.Sprintf("token %.3s...: status %d, want %d", tok, got, want)
		})
	}
	dumpOnFailure := func(s *server) {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("---- server log ----\n%s", tail(s.log(), 16<<10))
			}
		})
	}

	t.Run("sighup", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "tokens.json")
		writeTokens(t, file, false, old)
		s := newServer(t, "--tokens-file", file, "--reload-interval", "0")
		dumpOnFailure(s)
		s.start()
		wantStatus(s, old, 200)
		if got := authStatus(t, s, added); got != 401 {
			t.Fatalf("an unknown token: status %d, want 401", got)
		}

		writeTokens(t, file, false, added)
		if got := authStatus(t, s, added); got != 401 {
			t.Fatalf("with polling off, a changed file took effect before SIGHUP (status %d)", got)
		}
		s.cmd.Process.Signal(syscall.SIGHUP)
		wantStatus(s, added, 200)
		wantStatus(s, old, 401)
		if v := metricNum(t, s, `leasehold_reloads_total{what="tokens"}`); v != 1 {
			t.Fatalf("leasehold_reloads_total{what=tokens} = %v, want 1", v)
		}

		// A broken file: the tokens stay, the error is logged and counted.
		writeFileAs(t, file, false, `{"tokens":[{"name":"x","sha256":"not hex","scopes":["admin"]}]}`)
		s.cmd.Process.Signal(syscall.SIGHUP)
		eventuallyMsg(t, 20*time.Second, func() (bool, string) {
			v := metricNum(t, s, `leasehold_reload_errors_total{what="tokens"}`)
			return v == 1, fmt.Sprintf("leasehold_reload_errors_total{what=tokens} = %v", v)
		})
		if got := authStatus(t, s, added); got != 200 {
			t.Fatalf("after a broken file the token in force answers %d", got)
		}
		if lg := s.log(); !strings.Contains(lg, "reload failed; keeping the previous content") || strings.Contains(lg, added) || strings.Contains(lg, old) {
			t.Fatalf("the log should tell of the failed reload and hold no token:\n%s", tail(lg, 4<<10))
		}
		select {
		case <-s.exited:
			t.Fatal("SIGHUP stopped the server")
		default:
		}
	})

	t.Run("file-change", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "tokens.json")
		writeTokens(t, file, true, old)
		s := newServer(t, "--tokens-file", file, "--reload-interval", "100ms")
		dumpOnFailure(s)
		s.start()
		wantStatus(s, old, 200)

		// Rewritten in place, no signal: both work, then only the new one.
		writeTokens(t, file, true, old, added)
		wantStatus(s, added, 200)
		wantStatus(s, old, 200)
		writeTokens(t, file, true, added)
		wantStatus(s, old, 401)
		wantStatus(s, added, 200)

		// Broken: the last good set stays while the error is counted.
		writeFileAs(t, file, true, `{"tokens":[]}`)
		eventuallyMsg(t, 20*time.Second, func() (bool, string) {
			v := metricNum(t, s, `leasehold_reload_errors_total{what="tokens"}`)
			return v >= 1, fmt.Sprintf("leasehold_reload_errors_total{what=tokens} = %v", v)
		})
		if got := authStatus(t, s, added); got != 200 {
			t.Fatalf("after a broken file the token in force answers %d", got)
		}
		if got := authStatus(t, s, old); got != 401 {
			t.Fatalf("a removed token answers %d after a broken file", got)
		}
		// Fixed again: taken at the next poll.
		writeTokens(t, file, true, old)
		wantStatus(s, old, 200)
		wantStatus(s, added, 401)
	})
}
