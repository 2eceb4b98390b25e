//go:build linux

package chaos

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/chaos/lazyfs"
)

// TestNetnsPowerCutCanary proves that the power cuts catch a server that
// acknowledges writes it has not made durable: a binary built with
// canary_nosync (raft.db commits without fsync) must fail no-lost-acks or
// fencing in power-cut-all. A process kill alone would not catch it: the
// page cache survives a kill. Run by `make chaos-ci` (root).
func TestNetnsPowerCutCanary(t *testing.T) {
	if os.Getenv("LEASEHOLD_CHAOS_NETNS") != "1" {
		t.Skip("run by `make chaos-ci` with LEASEHOLD_CHAOS_NETNS=1")
	}
	needNetns(t)
	if err := lazyfs.Supported(); err != nil {
		t.Fatalf("the power-cut canary needs FUSE: %v", err)
	}
	factory, err := NewFactory("netns", FactoryOptions{Binary: buildLeasehold(t, "chaos,canary_nosync")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := FindScenario("power-cut-all")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if d := os.Getenv("LEASEHOLD_CHAOS_OUT"); d != "" {
		dir = d + "/canary_nosync"
	}
	required := []string{"no-lost-acks", "fencing"}
	var out strings.Builder
	caught := false
	for attempt := 0; attempt < 3 && !caught; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		res, err := RunSuite(ctx, SuiteConfig{Scenarios: []*Scenario{s}, Seed: uint64(9500 + 10*attempt), Dir: dir,
			Tier: "netns", New: factory, Out: &out})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, sum := range res.Summaries {
			if sum.Skipped != "" {
				t.Fatalf("skipped: %s", sum.Skipped)
			}
			for _, f := range sum.Failed() {
				t.Logf("attempt %d: %s failed: %s", attempt, f, verdictOf(sum, f))
				for _, c := range required {
					if f == c {
						caught = true
					}
				}
			}
		}
	}
	t.Log(out.String())
	if !caught {
		t.Fatalf("power-cut-all did not catch canary_nosync (want a failure of one of %v)", required)
	}
}
