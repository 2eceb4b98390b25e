package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// inprocScenarios are the scenarios the fast tier runs under -race: one or
// more per nemesis class the in-process cluster can inject (it cannot
// pause a node or move its clock; the netns tier covers those; it stalls
// disks through node.Config.WrapRaftStores).
var inprocScenarios = []string{
	"none", "partition-leader", "one-way-leader", "loss", "latency",
	"kill-leader", "transfer-storm", "snapshot-catchup", "remove-partitioned", "restore-under-load",
	"restore-lost-leader", "restore-large", "restore-during-backlog",
	"disk-stall-leader", "diverged-follower", "raft-dup-reorder",
}

// TestInprocScenarios runs the workloads and every checker against
// in-process clusters with injected faults, under the race detector.
func TestInprocScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("GAP under -short: the in-process chaos scenarios take minutes")
	}
	if activeCanary != "" {
		t.Skip("a canary is compiled in: TestCanary expects failures")
	}
	runScenariosIn(t, "inproc", inprocScenarios, FactoryOptions{}, 7000, RunConfig{}, inprocLanes)
}

// inprocLanes is how many in-process scenarios TestInprocScenarios runs
// at once: each mostly waits on its phases' timers (warm-up, fault,
// recovery) with three servers and a light workload, so two at a time
// nearly halve the tier's time without starving either of CPU on two
// cores.
const inprocLanes = 2

// runScenarios runs the named scenarios on a tier, one subtest each, and
// fails a subtest whose run fails any checker. Output goes to
// $LEASEHOLD_CHAOS_OUT if set (CI keeps it), else a temporary directory.
func runScenarios(t *testing.T, tier string, names []string, fo FactoryOptions, seed uint64) {
	runScenariosWith(t, tier, names, fo, seed, RunConfig{})
}

// runScenariosWith is runScenarios with per-run settings (rc's Warmup,
// Recovery, Workload...).
func runScenariosWith(t *testing.T, tier string, names []string, fo FactoryOptions, seed uint64, rc RunConfig) {
	runScenariosIn(t, tier, names, fo, seed, rc, 1)
}

// runScenariosIn is runScenariosWith running up to lanes scenarios at
// once (parallel subtests, each in its own cluster, directory and seed).
func runScenariosIn(t *testing.T, tier string, names []string, fo FactoryOptions, seed uint64, rc RunConfig, lanes int) {
	factory, err := NewFactory(tier, fo)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if d := os.Getenv("LEASEHOLD_CHAOS_OUT"); d != "" {
		dir = d
	}
	seed = chaosSeed(t, seed)
	lane := make(chan struct{}, max(lanes, 1))
	for i, name := range names {
		s, err := FindScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			if lanes > 1 {
				t.Parallel()
				lane <- struct{}{}
				defer func() { <-lane }()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			var out strings.Builder
			res, err := RunSuite(ctx, SuiteConfig{Scenarios: []*Scenario{s}, Seed: seed + uint64(i), Dir: dir + "/" + tier,
				Tier: tier, New: factory, Out: &out, Run: rc})
			if err != nil {
				t.Fatal(err)
			}
			sum := res.Summaries[0]
			t.Logf("%s: %d ops, %d ok, %.1f%% indeterminate, %d leader changes, %.0f s\n%s",
				name, sum.Ops, sum.OK, 100*sum.InfoRate, sum.LeaderChanges, sum.Seconds, out.String())
			if sum.Skipped != "" {
				t.Skipf("GAP: %s", sum.Skipped)
			}
			if !sum.Valid {
				var digest strings.Builder
				for _, v := range sum.Verdicts {
					if !v.Valid {
						t.Errorf("%s: %s %v", v.Checker, v.Detail, v.Samples)
						fmt.Fprintf(&digest, "%s: %s: %s %v\n", name, v.Checker, v.Detail, v.Samples)
					}
				}
				t.Errorf("replay: %s (output in %s)", sum.Replay, sum.Dir)
				fmt.Fprintf(&digest, "%s: replay: %s\n", name, sum.Replay)
				noteFailure(t, dir, digest.String())
			}
		})
	}
}

// failuresFile, in the output directory, collects one digest per failed
// scenario: `make chaos-ci` prints it after the test's output, so that the
// last lines of a failed CI run say which checker failed and how.
const failuresFile = "failures.txt"

// noteFailure appends digest to the output directory's failuresFile.
func noteFailure(t *testing.T, dir, digest string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Log(err)
		return
	}
	f, err := os.OpenFile(dir+"/"+failuresFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Log(err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(truncate(digest, 4000) + "\n"); err != nil {
		t.Log(err)
	}
}
