package main

// The README's five-minute tour, run as a newcomer would paste it: every sh
// block between <!-- tour --> and <!-- /tour --> in one bash -euo pipefail,
// against a real server started by the tour's own `make run &` line.

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tourScript returns the sh code of the README's tour: the fenced sh blocks
// between the tour markers, in order.
func tourScript(readme string) (string, bool) {
	_, rest, ok := strings.Cut(readme, "<!-- tour -->")
	if !ok {
		return "", false
	}
	region, _, ok := strings.Cut(rest, "<!-- /tour -->")
	if !ok {
		return "", false
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(region, -1) {
		blocks = append(blocks, m[1])
	}
	return strings.Join(blocks, "\n"), len(blocks) > 0
}

func TestTourScriptExtraction(t *testing.T) {
	md := "intro\n```sh\nnot this\n```\n<!-- tour -->\ntext\n```sh\necho a\n```\nmore\n```go\nx\n```\n```sh\necho b\n```\n<!-- /tour -->\n```sh\nnor this\n```\n"
	got, ok := tourScript(md)
	if !ok || got != "echo a\n\necho b\n" {
		t.Fatalf("tourScript = %q, %v", got, ok)
	}
	if _, ok := tourScript("no markers"); ok {
		t.Fatal("found a tour without markers")
	}
}

// TestTour runs the README's tour. The tour's `make` is replaced by a shell
// function (build: the binary this test built is already in ./bin; run: the
// server, as `make run` runs it), its fixed port 7700 by a free one, and
// the server's Raft and gossip ports by free ones through the environment
// the server reads (LEASEHOLD_<FLAG>); everything else runs as written.
func TestTour(t *testing.T) {
	bin := buildBinary(t)
	for _, tool := range []string{"bash", "curl", "awk", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's tour needs %s (README: The two commands): %v", tool, err)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, ok := tourScript(string(readme))
	if !ok {
		t.Fatal("README.md has no sh block between <!-- tour --> and <!-- /tour -->")
	}
	for _, want := range []string{"make build", "make run", "export PATH=$PWD/bin:$PATH", "localhost:7700/readyz", "kill %1"} {
		if !strings.Contains(script, want) {
			t.Fatalf("the tour no longer contains %q; update this test with it:\n%s", want, script)
		}
	}

	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin", "leasehold")); err != nil {
		t.Fatal(err)
	}
	httpAddr := freePort(t)
	_, port, _ := net.SplitHostPort(httpAddr)
	script = strings.ReplaceAll(script, "7700", port)

	prelude := `make() {
  case "$*" in
    build) test -x ./bin/leasehold ;;
    run) exec ./bin/leasehold server ;;
    *) echo "tour test: make $* is not stood in for" >&2; return 2 ;;
  esac
}
`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", prelude+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"LEASEHOLD_ADDR="+httpAddr, // the CLI's default is 127.0.0.1:7700
		"LEASEHOLD_HTTP_ADDR="+httpAddr,
		"LEASEHOLD_RAFT_ADDR="+freePort(t),
		"LEASEHOLD_GOSSIP_ADDR="+freePort(t),
		"LEASEHOLD_TOKEN=", "LEASEHOLD_TLS_CA=", "LEASEHOLD_TLS_CERT=", "LEASEHOLD_TLS_KEY=",
		"LEASEHOLD_CLIENT_CA=", "LEASEHOLD_CLIENT_CERT=", "LEASEHOLD_CLIENT_KEY=",
	)
	// Its own process group, so that the server the tour starts in the
	// background is ended with it whatever happens.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	runErr := cmd.Wait()
	logb, _ := os.ReadFile(filepath.Join(dir, "leasehold.log"))
	if runErr != nil {
		t.Fatalf("the tour failed: %v\noutput:\n%s\nserver log:\n%s", runErr, out.String(), logb)
	}
	o := out.String()
	for _, re := range []string{
		`\{"status":"ready"\}`,               // the readiness wait
		`(?m)^lease_id +ls_[0-9a-f]+$`,       // the CLI's acquire
		`(?m)^token +\S+$`,                   // with its secret token
		`LEASE_HELD: key "camera/7" is held`, // runner-b refused
		`held by runner-a`,
		`refused, as expected`,
		`(?m)^renewals +1$`,                           // the renewal worked with the captured id and token
		`(?m)^valid$`,                                 // validate
		`(?m)^end_reason +released$`,                  // the release worked
		`camera/7 is mine, fencing token \d+`,         // hold ran its command
		`"lease_id":"ls_[0-9a-f]+","key":"camera/8"`,  // curl acquire
		`"code":"LEASE_HELD"`,                         // curl refusal
		`"renewal_count":1`,                           // curl renew
		`"state":"released".*"end_reason":"released"`, // curl release
		`event: released`,                             // the event stream
	} {
		if !regexp.MustCompile(re).MatchString(o) {
			t.Errorf("tour output lacks %s\noutput:\n%s", re, o)
		}
	}
	if strings.Contains(o, "INVALID_ARGUMENT") || strings.Contains(o, "LEASE_TOKEN_INVALID") || strings.Contains(o, "NOT_FOUND") {
		t.Errorf("a tour step was refused:\n%s", o)
	}
	// `kill %1` stopped the server: its port stops answering.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the server still answers after the tour's kill %%1")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(string(logb), "127.0.0.1:"+port) {
		t.Errorf("the server log (leasehold.log) does not name its address:\n%s", logb)
	}
}
