package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/chaos"
)

func (a *app) chaosCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("chaos", "", "Run Jepsen-style fault scenarios against a cluster this command starts, record the history and check it.\n"+
		"Tier netns runs real `leasehold server` processes, each in its own network namespace (needs root, iproute2\n"+
		"and nftables); tier inproc runs nodes inside this process on loopback. Every run prints its seed;\n"+
		"--scenario NAME --seed N replays it. Exit status 1 if any run fails a checker.")
	tier := fs.String("tier", "netns", "netns (real processes in network namespaces) or inproc (in-process nodes on loopback)")
	scenarios := fs.String("scenario", "all", "comma-separated scenario names, 'all' (every scenario but random) or 'random'")
	runs := fs.Int("runs", 1, "runs of each scenario (seeds increase by one per run)")
	seed := fs.Uint64("seed", 0, "seed of the first run (0: random)")
	out := fs.String("out", "", "output directory (default ./chaos-out/<time>)")
	binPath := fs.String("binary", "", "leasehold binary the netns tier runs (default: this executable)")
	timeLimit := fs.Duration("time-limit", 0, "start no new run after this long (0: no limit)")
	list := fs.Bool("list", false, "list the scenarios and exit")
	keep := fs.Bool("keep-data", false, "keep the nodes' data directories of passing runs too")
	workers := fs.Int("workers", 8, "lease workload clients")
	if _, err := a.parse(fs, args, nil, 0); err != nil {
		return err
	}
	if *list {
		tw := tabwriter.NewWriter(a.stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "SCENARIO\tCLASS\tNODES\tDESCRIPTION")
		for _, s := range chaos.Scenarios() {
			n := s.Nodes
			if n == 0 {
				n = 5
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.Name, s.Class, n, s.Doc)
		}
		return tw.Flush()
	}
	var picked []*chaos.Scenario
	switch *scenarios {
	case "all":
		for _, s := range chaos.Scenarios() {
			if s.Name != "random" {
				picked = append(picked, s)
			}
		}
	default:
		for _, name := range strings.Split(*scenarios, ",") {
			s, err := chaos.FindScenario(strings.TrimSpace(name))
			if err != nil {
				return usageErrorf("%v", err)
			}
			picked = append(picked, s)
		}
	}
	if *seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		*seed = binary.LittleEndian.Uint64(b[:])>>16 + 1
	}
	if *out == "" {
		*out = filepath.Join("chaos-out", time.Now().Format("20060102-150405"))
	}
	bin := *binPath
	if bin == "" && *tier == "netns" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("chaos: cannot find this executable (pass --binary): %w", err)
		}
		bin = exe
	}
	factory, err := chaos.NewFactory(*tier, chaos.FactoryOptions{Binary: bin})
	if err != nil {
		return usageErrorf("%v", err)
	}
	fmt.Fprintf(a.stdout, "chaos: tier %s, seed %d, %d scenario(s) x %d run(s), output in %s\n", *tier, *seed, len(picked), *runs, *out)
	sc := chaos.SuiteConfig{Scenarios: picked, Seed: *seed, Runs: *runs, Dir: *out, Tier: *tier, New: factory, Out: a.stdout,
		Run: chaos.RunConfig{KeepData: *keep, Workload: chaos.WorkloadConfig{LeaseWorkers: *workers}}}
	if *timeLimit > 0 {
		sc.Deadline = time.Now().Add(*timeLimit)
	}
	res, err := chaos.RunSuite(ctx, sc)
	if err != nil {
		return err
	}
	if !res.Valid {
		return &exitError{code: 1, msg: "chaos: a run failed its checks (see the table and " + filepath.Join(*out, "suite.json") + ")"}
	}
	return nil
}
