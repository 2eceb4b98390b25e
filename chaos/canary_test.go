package chaos

import (
	"context"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// activeCanary is the canary build tag this test binary was built with
// (set by canary_<name>_test.go), "" in a normal build.
var activeCanary string

// canarySpec is what must catch one canary: the one checker that must
// fail (others may fail too), on which tier, in which scenarios.
type canarySpec struct {
	// checker must fail in at least one run: the verdict name in
	// summary.json (a scenario's own guard has one too: the bit-flip
	// scenario's "never ready with a divergent state" is bitflip-guard).
	checker string
	// tier: "inproc" (the bug compiled into this test binary) or "netns"
	// (the server binary built with the canary's tag, see
	// canary_netns_test.go).
	tier      string
	scenarios []string
	// recovery, if set, is the run's RunConfig.Recovery: how long the
	// workloads go on after the nemesis healed.
	recovery time.Duration
	// race builds the netns server binary with -race.
	race bool
}

// canaries names, per canary, the checker that must catch it. Each checker
// has at least one canary here, so none of them passes for want of ever
// being able to fail.
var canaries = map[string]canarySpec{
	// A lease ended a tick before its TTL: another client holds the key
	// while the first still believes it does.
	"canary_early_expiry": {checker: "holder-windows", tier: "inproc", scenarios: []string{"none"}},
	// Reads answered from a partitioned leader's local state: its frozen
	// tick, read after a newer one, is caught by clock every time; lease
	// reads (linearizable) only when a key changed hands meanwhile.
	"canary_stale_read": {checker: "clock", tier: "inproc", scenarios: []string{"partition-leader"}},
	// The fencing counter rolled back: a later grant gets a lower token.
	"canary_fence_reset": {checker: "fencing", tier: "inproc", scenarios: []string{"none"}},
	// A renewal with someone else's token renews their lease.
	"canary_renew_token": {checker: "linearizable", tier: "inproc", scenarios: []string{"none"}},
	// A new leader ticks at once: handed on after every tick, the clock
	// runs fast.
	"canary_tick_at_once": {checker: "clock", tier: "inproc", scenarios: []string{"transfer-storm"}},
	// The next holder of a released key gets its token again: the fenced
	// resource accepts two leases' writes with one token.
	"canary_fence_repeat": {checker: "fenced-counter", tier: "inproc", scenarios: []string{"none"}},
	// Every server restarted at once forgets its log's last entries: grants
	// it acknowledged are gone.
	"canary_lose_tail": {checker: "no-lost-acks", tier: "inproc", scenarios: []string{"kill-all"}},
	// Replicas record their own wall clock in a grant: their states differ.
	"canary_wall_apply": {checker: "convergence", tier: "inproc", scenarios: []string{"none"}},
	// After the leader is cut off its successor never ticks: the run goes
	// on 15 s after healing, longer than LivenessBound.
	"canary_clock_stops": {checker: "liveness", tier: "inproc", scenarios: []string{"partition-leader"}, recovery: 15 * time.Second},
	// After the leader is cut off its successor grants nothing: no write
	// succeeds within the recovery checker's 30 s.
	"canary_writes_stuck": {checker: "recovery", tier: "inproc", scenarios: []string{"partition-leader"}},
	// On real processes: the fence roll-back, through the server binary.
	// Its fencing catches it there too.
	"canary_fence_reset@netns": {checker: "fencing", tier: "netns", scenarios: []string{"none"}},
	// A data race in the acquire path of a -race server binary: its report
	// lands in the node's log.
	"canary_data_race": {checker: "logs-clean", tier: "netns", scenarios: []string{"none"}, race: true},
	// The corruption guard off: a follower whose log rotted applies the
	// damaged entries and serves the state they make as ready.
	"canary_no_guard": {checker: "bitflip-guard", tier: "netns", scenarios: []string{"bitflip-payload"}},
	// A harness fault: a follower's configuration rewritten to itself
	// alone (`leasehold data recover`) while the others run on; its voter
	// set changes by more than one voter, to one no leader appended.
	"canary_config_recover": {checker: "configuration", tier: "netns", scenarios: []string{"churn-remove-partition"}},
}

// canarySpecs are the specs of the canary compiled into this test binary,
// for one tier: the canary's own entry and its name@tier entries.
func canarySpecs(tier string) map[string]canarySpec {
	out := map[string]canarySpec{}
	for name, spec := range canaries {
		base, _, _ := strings.Cut(name, "@")
		if base == activeCanary && spec.tier == tier {
			out[name] = spec
		}
	}
	return out
}

// TestCanaryTable: every canary tag the Makefile runs has a spec, and every
// checker has a canary that must make it fail.
func TestCanaryTable(t *testing.T) {
	var checkers []string
	for name, spec := range canaries {
		if len(spec.scenarios) == 0 || (spec.tier != "inproc" && spec.tier != "netns") {
			t.Errorf("%s: no scenario, or tier %q", name, spec.tier)
		}
		for _, s := range spec.scenarios {
			if _, err := FindScenario(s); err != nil {
				t.Error(err)
			}
		}
		checkers = append(checkers, spec.checker)
	}
	for _, c := range []string{"linearizable", "holder-windows", "fencing", "fenced-counter", "no-lost-acks",
		"convergence", "recovery", "clock", "liveness", "logs-clean", "bitflip-guard", "configuration"} {
		if !slices.Contains(checkers, c) {
			t.Errorf("no canary must fail %s", c)
		}
	}
}

// TestCanary proves the suite catches a deliberate bug compiled into the
// product: built with -tags canary_<name> (make canaries), it runs the
// in-process scenarios that target it and fails unless the named checker
// fails (TestNetnsCanary does the same on real processes).
func TestCanary(t *testing.T) {
	if activeCanary == "" {
		t.Skip("no canary compiled in; `make canaries` builds this test once per canary tag")
	}
	specs := canarySpecs("inproc")
	if len(specs) == 0 {
		if len(canarySpecs("netns")) > 0 {
			t.Skipf("%s is caught on real processes: TestNetnsCanary", activeCanary)
		}
		t.Fatalf("no scenario targets %s", activeCanary)
	}
	factory, err := NewFactory("inproc", FactoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range specs {
		runCanary(t, name, spec, "inproc", factory)
	}
}

// runCanary runs spec's scenarios, up to three times with other seeds,
// until its checker fails; it fails the test if it never does.
func runCanary(t *testing.T, name string, spec canarySpec, tier string, factory ClusterFactory) {
	var scen []*Scenario
	for _, s := range spec.scenarios {
		sc, err := FindScenario(s)
		if err != nil {
			t.Fatal(err)
		}
		scen = append(scen, sc)
	}
	dir := t.TempDir()
	if d := os.Getenv("LEASEHOLD_CHAOS_OUT"); d != "" {
		dir = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	start := time.Now()
	caught := false
	var out strings.Builder
	base := chaosSeed(t, 1000)
	for attempt := 0; attempt < 3 && !caught; attempt++ {
		res, err := RunSuite(ctx, SuiteConfig{Scenarios: scen, Seed: base + uint64(10*attempt), Dir: dir, Tier: tier, New: factory, Out: &out,
			Run: RunConfig{Workload: WorkloadConfig{LeaseWorkers: 10, Keys: 2}, CheckTimeout: 20 * time.Second, Recovery: spec.recovery}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Summaries {
			failed := s.Failed()
			sort.Strings(failed)
			t.Logf("%s: %s (seed %d) failed %v", name, s.Scenario, s.Seed, failed)
			if slices.Contains(failed, spec.checker) {
				caught = true
				t.Logf("%s caught by %s in %s (seed %d, %.0f s in all): %v", name, spec.checker, s.Scenario, s.Seed,
					time.Since(start).Seconds(), verdictOf(s, spec.checker))
			}
		}
	}
	t.Log(out.String())
	if !caught {
		t.Fatalf("the suite did not catch %s: %s never failed", name, spec.checker)
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
