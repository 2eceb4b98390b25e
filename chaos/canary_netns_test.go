//go:build linux

package chaos

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
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
		bin := canaryBinary(t, spec.race)
		factory, err := NewFactory("netns", FactoryOptions{Binary: bin})
		if err != nil {
			t.Fatal(err)
		}
		runCanary(t, name, spec, "netns", factory)
	}
}

// canaryBinary builds cmd/leasehold with the chaos tag and the active
// canary's, with -race if race, into the test's temporary directory.
func canaryBinary(t *testing.T, race bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leasehold-"+activeCanary)
	args := []string{"build", "-tags", "chaos," + activeCanary, "-o", path}
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
