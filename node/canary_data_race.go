//go:build !canary_data_race

package node

// canaryDataRace (build tag canary_data_race) is a deliberate bug for the
// chaos suite to catch: every acquire counts itself in a package variable
// without synchronisation, a data race between concurrent requests that a
// binary built with -race reports in its log. Never set in a normal build.
var canaryAcquires int // canary_data_race's unsynchronised counter

const canaryDataRace = false
