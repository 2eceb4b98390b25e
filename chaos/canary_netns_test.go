//go:build linux

package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNetnsCanary proves the suite catches a deliberate bug on real
// processes: built with -tags canary_<name> (make canaries), it builds the
// server binary with the chaos tag and that canary's (and -race when the
// canary says so), runs the scenarios that target it in network namespaces
// and fails unless the named checker fails. Root only.
func TestNetnsCanary(t *testing.T) {
	if activeCanary == "" {
		t.Skip("no canary compiled in; `make canaries` builds this test once per canary tag")
	}
	specs := canarySpecs("netns")
	if len(specs) == 0 {
		t.Skipf("%s is caught in process: TestCanary", activeCanary)
	}
	needNetns(t)
	for name, spec := range specs {
		bin := buildBinary(t, "chaos,"+activeCanary, spec.race)
		factory, err := NewFactory("netns", FactoryOptions{Binary: bin})
		if err != nil {
			t.Fatal(err)
		}
		runCanary(t, name, spec, "netns", factory)
	}
}

// buildBinary builds cmd/leasehold with tags, with -race if race, into the
// test's temporary directory.
func buildBinary(t *testing.T, tags string, race bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leasehold")
	args := []string{"build", "-tags", tags, "-o", path}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "../cmd/leasehold")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatal(fmt.Errorf("go %v: %v\n%s", args, err, out.String()))
	}
	return path
}

// TestNetnsRaceScenarios runs the scenarios LEASEHOLD_CHAOS_RACE names
// (comma-separated; `make chaos-ci` sets a few) against a server binary
// built with -race and the chaos tag: logs-clean fails on any data race
// the servers report.
func TestNetnsRaceScenarios(t *testing.T) {
	list := os.Getenv("LEASEHOLD_CHAOS_RACE")
	if list == "" || os.Getenv("LEASEHOLD_CHAOS_NETNS") != "1" {
		t.Skip("run by `make chaos-ci` with LEASEHOLD_CHAOS_NETNS=1 and LEASEHOLD_CHAOS_RACE=scenario,...")
	}
	if activeCanary != "" {
		t.Skip("a canary is compiled in")
	}
	needNetns(t)
	bin := buildBinary(t, "chaos", true)
	// A -race server is several times slower: a longer warm-up gives the
	// workloads their operations before the first fault.
	runScenariosWith(t, "netns", strings.Split(list, ","), FactoryOptions{Binary: bin}, 9500, RunConfig{Warmup: 10 * time.Second})
}
