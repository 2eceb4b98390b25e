package chaos

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// activeCanary is the canary build tag this test binary was built with
// (set by canary_<name>_test.go), "" in a normal build.
var activeCanary string

// canaryScenarios names, per canary, the in-process scenarios that must
// catch it and the checkers whose failure counts as catching it. A stale
// read shows up in lease reads (linearizable) or in the linearizable tick
// reads (clock: a stale, lower tick followed by a current one looks like a
// clock running fast).
var canaryScenarios = map[string]struct {
	scenarios []string
	checkers  []string
}{
	"canary_early_expiry": {[]string{"none"}, []string{"linearizable", "holder-windows"}},
	"canary_stale_read":   {[]string{"partition-leader"}, []string{"linearizable", "clock"}},
	"canary_fence_reset":  {[]string{"none"}, []string{"linearizable", "fencing"}},
	"canary_renew_token":  {[]string{"none"}, []string{"linearizable"}},
	"canary_tick_at_once": {[]string{"transfer-storm"}, []string{"clock", "linearizable", "holder-windows"}},
}

// TestCanary proves the suite catches a deliberate bug: built with
// -tags canary_<name> (make canaries), it runs the scenarios that target
// that bug on the in-process tier and fails unless a safety checker fails.
func TestCanary(t *testing.T) {
	if activeCanary == "" {
		t.Skip("no canary compiled in; `make canaries` builds this test once per canary tag")
	}
	want, ok := canaryScenarios[activeCanary]
	if !ok {
		t.Fatalf("no scenario targets %s", activeCanary)
	}
	factory, err := NewFactory("inproc", FactoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var scen []*Scenario
	for _, name := range want.scenarios {
		s, err := FindScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		scen = append(scen, s)
	}
	dir := t.TempDir()
	if d := os.Getenv("LEASEHOLD_CHAOS_OUT"); d != "" {
		dir = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	caught := false
	var out strings.Builder
	for attempt := 0; attempt < 3 && !caught; attempt++ {
		res, err := RunSuite(ctx, SuiteConfig{Scenarios: scen, Seed: uint64(1000 + 10*attempt), Dir: dir, Tier: "inproc", New: factory, Out: &out,
			Run: RunConfig{Workload: WorkloadConfig{LeaseWorkers: 10, Keys: 2}, CheckTimeout: 20 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Summaries {
			for _, f := range s.Failed() {
				for _, c := range want.checkers {
					if f == c {
						caught = true
						t.Logf("%s caught by %s in %s (seed %d): %v", activeCanary, f, s.Scenario, s.Seed, verdictOf(s, f))
					}
				}
			}
		}
	}
	t.Log(out.String())
	if !caught {
		t.Fatalf("the suite did not catch %s (want a failure of %v)", activeCanary, want.checkers)
	}
}

func verdictOf(s *Summary, checker string) string {
	for _, v := range s.Verdicts {
		if v.Checker == checker {
			return v.Detail + " " + strings.Join(v.Samples, "; ")
		}
	}
	return ""
}
