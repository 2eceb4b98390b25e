package chaos

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// seedEnv names the seed of the suite's tests: unset, the test's fixed seed
// (the regression set: every run places faults the same way); "time", a
// seed derived from the clock, so that CI places them differently each
// run; a number, that seed (to replay a run whose log printed it).
const seedEnv = "LEASEHOLD_CHAOS_SEED"

// chaosSeed is the base seed of a test (fixed if seedEnv is unset), logged
// with how to replay it.
func chaosSeed(t *testing.T, fixed uint64) uint64 {
	t.Helper()
	seed := fixed
	switch v := os.Getenv(seedEnv); v {
	case "":
	case "time":
		seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1_000_000
	default:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number or \"time\"", seedEnv, v)
		}
		seed = n
	}
	t.Logf("base seed %d (replay: %s=%d; each run's own seed and replay command are in its summary)", seed, seedEnv, seed)
	return seed
}
