package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBenchScaleServerScript runs `make bench-scale-server` (the Makefile's
// BENCH_SCALE_SERVER script) on the test's binary at a tiny scale: it fills
// the leases, stops and restarts the server, downloads a snapshot and
// prints every figure (no timing is checked).
func TestBenchScaleServerScript(t *testing.T) {
	t.Parallel() // its own ports and directory; mostly waiting on the server
	bin := buildBinary(t)
	for _, tool := range []string{"curl", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("the script needs " + tool)
		}
	}
	port := func() string { a := freePort(t); return a[strings.LastIndexByte(a, ':')+1:] }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// -o build: the binary is the test's, not one the Makefile builds.
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", "../..", "-o", "build", "bench-scale-server", "BIN="+bin)
	// RSS_STILL=1: the figures are not checked, so one still second is
	// settled enough (the script's 3 took 6 of the test's seconds).
	cmd.Env = append(cmd.Environ(), "LEASES=300", "CLIENTS=4", "TTL=10m", "RSS_STILL=1",
		"PORT="+port(), "RAFT_PORT="+port(), "GOSSIP_PORT="+port(), "PPROF_PORT="+port())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	for _, want := range []string{"leases filled                    300 ", "server RSS, after GC, settled", "stop (SIGTERM to exit)",
		"restart to /readyz", "snapshot restore", "snapshot download"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in the output:\n%s", want, out)
		}
	}
	t.Logf("\n%s", out)
}
