package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchSpawn runs `leasehold bench --spawn 1,3`: it starts a one-server
// cluster, then a three-server one, benches each leader (the half-load
// workload paced at half the cycle's rate) and leaves no server or data
// directory behind.
func TestBenchSpawn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four servers")
	}
	tmp := t.TempDir()
	cmd := exec.Command(buildBinary(t), "bench", "--spawn", "1,3", "--workload", "cycle,half-load,contended",
		"--clients", "4", "--duration", "1s", "--json")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "LEASEHOLD_ADDR=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
	if err != nil && r.status <= 0 {
		t.Fatalf("run bench: %v", err)
	}
	if r.status != 0 {
		t.Fatalf("bench --spawn: status %d\nstderr: %s", r.status, r.stderr)
	}
	var res []benchResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("stdout is not the results: %v\n%s", err, r.stdout)
	}
	var got []string
	for _, x := range res {
		got = append(got, x.Workload+"@"+itoa(x.Servers))
		if x.Ops == 0 || x.Errors != 0 {
			t.Errorf("%s on %d servers: %d ops, %d errors (%v)", x.Workload, x.Servers, x.Ops, x.Errors, x.ErrorCodes)
		}
	}
	want := "cycle@1 half-load@1 contended@1 cycle@3 half-load@3 contended@3"
	if strings.Join(got, " ") != want {
		t.Fatalf("results %q, want %q", got, want)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "leasehold-bench-*"))
	if len(left) != 0 {
		t.Errorf("data directories left behind: %v", left)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestBenchSpawnUsage: --spawn's bad values and combinations are usage
// errors (status 2) that start nothing.
func TestBenchSpawnUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--spawn", "0"},
		{"bench", "--spawn", "8"},
		{"bench", "--spawn", "x"},
		{"bench", "--spawn", "1", "--addr", "127.0.0.1:1"},
		{"bench", "--addr", "127.0.0.1:1", "--workload", "half-load"},
		{"bench", "--workload", "cycle,nope"},
		{"bench", "--spawn", "1", "--raft-log", "rocks"},
		{"bench", "--raft-log", "wal"},
	} {
		if r := runBinary(t, args...); r.status != 2 {
			t.Errorf("%q: status %d, want 2 (usage)\nstderr: %s", args, r.status, r.stderr)
		}
	}
}
