package recipe

import "testing"

// SetBackoffRand makes the recipes' retry backoffs draw from f for the
// rest of the test (see client.Backoff.Rand).
func SetBackoffRand(t testing.TB, f func(n int64) int64) {
	backoffRand = f
	t.Cleanup(func() { backoffRand = nil })
}
