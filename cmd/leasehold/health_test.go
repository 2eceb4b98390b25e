package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthCommand(t *testing.T) {
	ready := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
			writeJSONTest(w, 200, map[string]string{"status": "ok"})
		case r.URL.Path == "/readyz" && ready:
			writeJSONTest(w, 200, map[string]string{"status": "ready"})
		case r.URL.Path == "/readyz":
			writeJSONTest(w, 503, map[string]any{"error": map[string]any{"code": "NO_LEADER", "message": "no leader"}})
		default:
			t.Errorf("unexpected %s", r.URL)
		}
	}))
	defer srv.Close()
	run := func(env map[string]string, args ...string) (int, string, string) {
		a, out, errb := testApp(env)
		return report(a.run(context.Background(), append([]string{"health"}, args...)), errb), out.String(), errb.String()
	}
	if code, _, errs := run(nil, "--addr", srv.URL); code != 1 || !strings.Contains(errs, "unhealthy: 503") || !strings.Contains(errs, "NO_LEADER") {
		t.Errorf("not ready: exit %d, stderr %q", code, errs)
	}
	if code, out, _ := run(nil, "--addr", srv.URL, "--live"); code != 0 || !strings.Contains(out, "healthy") {
		t.Errorf("--live: exit %d, stdout %q", code, out)
	}
	ready = true
	if code, out, _ := run(map[string]string{"LEASEHOLD_ADDR": srv.URL}); code != 0 || !strings.Contains(out, "/readyz") {
		t.Errorf("ready: exit %d, stdout %q", code, out)
	}
	if code, out, _ := run(nil, "--addr", srv.URL, "--quiet"); code != 0 || out != "" {
		t.Errorf("--quiet: exit %d, stdout %q", code, out)
	}
	if code, _, errs := run(nil, "--addr", "127.0.0.1:1", "--timeout", "2s"); code != 1 || !strings.Contains(errs, "unhealthy") {
		t.Errorf("unreachable: exit %d, stderr %q", code, errs)
	}
}

func TestHealthURL(t *testing.T) {
	for _, tt := range []struct {
		env      map[string]string
		addr     string
		want     string
		insecure bool
	}{
		{nil, "", "http://127.0.0.1:7700", false},
		{nil, "h:1", "http://h:1", false},
		{nil, "https://h:1/", "https://h:1", false},
		{map[string]string{"LEASEHOLD_HTTP_ADDR": "0.0.0.0:7700"}, "", "http://127.0.0.1:7700", false},
		{map[string]string{"LEASEHOLD_HTTP_ADDR": ":7800"}, "", "http://127.0.0.1:7800", false},
		{map[string]string{"LEASEHOLD_HTTP_ADDR": "[::]:7700"}, "", "http://[::1]:7700", false},
		{map[string]string{"LEASEHOLD_HTTP_ADDR": "10.0.0.5:7700", "LEASEHOLD_TLS_CERT": "/c.pem"}, "", "https://10.0.0.5:7700", true},
		{map[string]string{"LEASEHOLD_HTTP_ADDR": "0.0.0.0:7700", "LEASEHOLD_TLS_CERT": "/c.pem"}, "h:1", "http://h:1", false},
	} {
		a, _, _ := testApp(tt.env)
		if got, insecure := a.healthURL(tt.addr); got != tt.want || insecure != tt.insecure {
			t.Errorf("healthURL(%q) with %v = %q %v, want %q %v", tt.addr, tt.env, got, insecure, tt.want, tt.insecure)
		}
	}
}

// TestProcessHealth: the command against a real server process.
func TestProcessHealth(t *testing.T) {
	s := newServer(t)
	s.start()
	if r := runBinary(t, "health", "--addr", s.http); r.status != 0 || !strings.Contains(r.stdout, "ready") {
		t.Fatalf("health: %+v", r)
	}
	cmd := []string{"health"}
	r := runBinary(t, append(cmd, "--addr", freePort(t))...)
	if r.status != 1 {
		t.Fatalf("health of nothing: %+v", r)
	}
}
