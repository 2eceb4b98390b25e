//go:build linux

package chaos

import (
	"os"
	"testing"
)

// TestNetnsScenarios runs every scenario once against real server
// processes in network namespaces, built with the chaos tag so clock faults
// work. It takes about ten minutes, so `go test ./...` leaves it to
// `make chaos-ci`, which sets LEASEHOLD_CHAOS_NETNS=1.
func TestNetnsScenarios(t *testing.T) {
	if os.Getenv("LEASEHOLD_CHAOS_NETNS") != "1" {
		t.Skip("run by `make chaos-ci` with LEASEHOLD_CHAOS_NETNS=1")
	}
	needNetns(t)
	var names []string
	for _, s := range Scenarios() {
		names = append(names, s.Name)
	}
	runScenarios(t, "netns", names, FactoryOptions{Binary: buildLeasehold(t, "chaos")}, 9000)
}
