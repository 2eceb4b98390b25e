package chaos

import (
	"context"
	"slices"
	"time"
)

// The built-in scenarios (Scenarios, FindScenario).

const faultFor = 6 * time.Second

// wideStall is the liveness bound of the scenarios that check liveness
// beside their own fault: twice LivenessBound, as the in-process tier runs
// them under the race detector on a shared machine. A clock that stopped
// fails it all the same.
const wideStall = 2 * LivenessBound

// builtin is the one table of the built-in scenarios, one file per fault
// class (scenario_partition.go, scenario_loss_latency.go, scenario_crash.go,
// scenario_clock.go, scenario_disk.go, scenario_membership.go,
// scenario_snapshot.go; init functions elsewhere append more). Keep the order:
// the random scenario draws from builtin by index, so a seed replays only
// against the same order.
var builtin = slices.Concat(
	noneScenarios,
	partitionScenarios,
	lossLatencyScenarios,
	crashScenarios,
	clockScenarios,
	diskStallScenarios,
	transferScenarios,
	membershipScenarios,
	snapshotScenarios,
	restoreScenarios,
	diskFullScenarios,
	identityScenarios,
)

// noneScenarios run the workloads and checkers without faults.
var noneScenarios = []*Scenario{
	{Name: "none", Liveness: true, StallBound: wideStall, Class: "none", Nodes: 3, Doc: "no faults: the workloads and checkers alone (zombie counter writers must be refused by token)",
		Expect:  map[string]int{"stale-token-rejected": 1},
		Nemesis: func(ctx context.Context, e *Env) error { return sleepCtx(ctx, faultFor) }},
}
