package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// randomScenario strings together random faults from the built-in
// scenarios that need no special cluster setup: the randomized combination
// `make chaos` runs.
var randomScenario = &Scenario{
	Name: "random", Class: "random", Liveness: true, StallBound: wideStall,
	Doc: "four random faults in a row (partitions, loss, latency, crashes, pauses, clock faults, disk stalls, transfer storms), with calm in between",
	Nemesis: func(ctx context.Context, e *Env) error {
		var pool []*Scenario
		for _, s := range builtin {
			switch s.Class {
			case "partition", "loss", "latency", "crash", "pause", "clock", "disk", "transfer":
				if s.nodes() == 5 || e.C.Size() == s.nodes() {
					pool = append(pool, s)
				}
			}
		}
		ran := 0
		for step := 0; step < 4; step++ {
			s := pool[e.Rng.IntN(len(pool))]
			e.Note("random-step", s.Name, nil)
			err := s.Nemesis(ctx, e)
			_ = e.C.Heal()
			if errors.Is(err, ErrUnsupported) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			ran++
			if err := sleepCtx(ctx, 2*time.Second); err != nil {
				return err
			}
		}
		e.Count("random-steps", ran)
		return nil
	},
	Expect: map[string]int{"random-steps": 2},
}

func init() { builtin = append(builtin, randomScenario) }

// SuiteConfig is a series of runs.
type SuiteConfig struct {
	Scenarios []*Scenario
	// Seed of the first run; each further run adds one.
	Seed uint64
	// Runs per scenario (default 1).
	Runs int
	Dir  string
	Tier string
	New  ClusterFactory
	// Run carries the per-run settings (Workload, Warmup, ...); its
	// Scenario, Seed, Dir, Tier and New are set per run.
	Run RunConfig
	// Deadline, if set, stops starting new runs after it.
	Deadline time.Time
	Out      io.Writer
}

// SuiteResult is every run's summary, in order.
type SuiteResult struct {
	Summaries []*Summary `json:"runs"`
	Valid     bool       `json:"valid"`
}

// RunSuite runs the scenarios in turn, each in its own directory under Dir,
// and writes Dir/suite.json and a table to Out.
func RunSuite(ctx context.Context, sc SuiteConfig) (*SuiteResult, error) {
	sc.Runs = cmp.Or(sc.Runs, 1)
	if err := os.MkdirAll(sc.Dir, 0o755); err != nil {
		return nil, err
	}
	res := &SuiteResult{Valid: true}
	seed := sc.Seed
	for r := 0; r < sc.Runs; r++ {
		for _, s := range sc.Scenarios {
			if ctx.Err() != nil || (!sc.Deadline.IsZero() && time.Now().After(sc.Deadline)) {
				break
			}
			rc := sc.Run
			rc.Scenario, rc.Seed, rc.Tier, rc.New = s, seed, sc.Tier, sc.New
			rc.Dir = filepath.Join(sc.Dir, fmt.Sprintf("%s-%d", s.Name, seed))
			rc.Progress = sc.Out
			seed++
			sum, err := Run(ctx, rc)
			if err != nil {
				sum = &Summary{Scenario: s.Name, Tier: sc.Tier, Seed: rc.Seed, Error: err.Error(), Dir: rc.Dir}
			}
			if !sum.Valid {
				res.Valid = false
			}
			res.Summaries = append(res.Summaries, sum)
		}
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(sc.Dir, "suite.json"), append(b, '\n'), 0o644); err != nil {
		return res, err
	}
	if sc.Out != nil {
		WriteTable(sc.Out, res.Summaries)
	}
	return res, nil
}

// WriteTable prints one line per run: verdict, operations, indeterminate
// share, leader changes and the failed checkers.
func WriteTable(w io.Writer, sums []*Summary) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tTIER\tSEED\tVERDICT\tOPS\tOK\tINDETERMINATE\tLEADER CHANGES\tSECONDS\tNOTES")
	for _, s := range sums {
		verdict := "PASS"
		notes := ""
		switch {
		case s.Skipped != "":
			verdict, notes = "SKIP", s.Skipped
		case !s.Valid:
			verdict = "FAIL"
			notes = strings.Join(s.Failed(), ",")
			if s.Error != "" {
				notes = s.Error
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%.1f%%\t%d\t%.0f\t%s\n", s.Scenario, s.Tier, s.Seed, verdict, s.Ops, s.OK,
			100*s.InfoRate, s.LeaderChanges, s.Seconds, notes)
	}
	tw.Flush()
}
