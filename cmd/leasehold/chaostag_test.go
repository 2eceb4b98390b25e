package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestChaosClockOnlyInChaosBuild: the controllable clock exists only in a
// binary built with the `chaos` tag. The marker symbol is looked for in both
// builds, so the check fails if the tag stops mattering either way.
func TestChaosClockOnlyInChaosBuild(t *testing.T) {
	t.Parallel() // a build and a link: beside the disk tests, which wait on their servers
	if testing.Short() {
		t.Skip("builds the binary twice; skipped in -short mode")
	}
	const marker = "github.com/leasehold/leasehold/node.chaosClockMarker"
	dir := t.TempDir()
	// The normal build is the one the process-level tests run (buildBinary).
	symbols := func(tags string) string {
		t.Helper()
		bin := buildBinary(t)
		if tags != "" {
			bin = filepath.Join(dir, "leasehold"+tags)
			if out, err := goBuild("-o", bin, "-tags", tags, ".").CombinedOutput(); err != nil {
				t.Fatalf("go build %s: %v\n%s", tags, err, out)
			}
		}
		out, err := exec.Command("go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatalf("go tool nm: %v", err)
		}
		return string(out)
	}
	if !strings.Contains(symbols("chaos"), marker) {
		t.Fatalf("the chaos build has no %s", marker)
	}
	normal := symbols("")
	if strings.Contains(normal, "node.chaosClock") || strings.Contains(normal, "node.pollChaos") {
		t.Fatal("a normal build contains the chaos clock")
	}
	if !strings.Contains(normal, "github.com/leasehold/leasehold/node.Open") {
		t.Fatal("no node.Open in the normal build's symbols: the check looks in the wrong place")
	}
}
