// Command leasehold-chaos runs the chaos suite (package chaos): Jepsen-style
// fault scenarios against a cluster it starts, with the history recorded
// and checked. It is a command of its own so that the server binary,
// leasehold, links none of the suite (nor its linearizability checker).
//
// Tier netns runs real `leasehold server` processes, each in its own
// network namespace (root, iproute2 and nftables); build the server with
// `-tags chaos` for the clock scenarios (`make chaos` does both). Tier
// inproc runs nodes inside this process on loopback.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a problem with the command line (exit status 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// run runs the command and returns its exit status: 0 when every run passed
// its checks, 1 when one failed (or the suite could not run), 2 for a bad
// command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := suite(ctx, args, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	return 1
}

func suite(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("leasehold-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: leasehold-chaos [flags]\n\n"+
			"Run Jepsen-style fault scenarios against a cluster this command starts, record the history and check it.\n"+
			"Tier netns runs real `leasehold server` processes, each in its own network namespace (needs root, iproute2\n"+
			"and nftables); tier inproc runs nodes inside this process on loopback. Every run prints its seed;\n"+
			"--scenario NAME --seed N replays it. Exit status 1 if any run fails a checker.\n\nflags:")
		fs.PrintDefaults()
	}
	tier := fs.String("tier", "netns", "netns (real processes in network namespaces) or inproc (in-process nodes on loopback)")
	scenarios := fs.String("scenario", "all", "comma-separated scenario names, 'all' (every scenario but random) or 'random'")
	runs := fs.Int("runs", 1, "runs of each scenario (each run's seed is one more than the last)")
	seed := fs.Uint64("seed", 0, "seed of the first run (0: random)")
	out := fs.String("out", "", "output directory (default ./chaos-out/<time>)")
	binPath := fs.String("binary", "", "leasehold server binary the netns tier runs (default: leasehold next to this executable; build it with -tags chaos for the clock scenarios)")
	timeLimit := fs.Duration("time-limit", 0, "start no new run after this long (0: no limit)")
	list := fs.Bool("list", false, "list the scenarios and exit")
	keep := fs.Bool("keep-data", false, "keep the nodes' data directories of passing runs too")
	workers := fs.Int("workers", 8, "lease workload clients")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *list {
		return listScenarios(stdout)
	}
	picked, err := pickScenarios(*scenarios)
	if err != nil {
		return err
	}
	if *seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		*seed = binary.LittleEndian.Uint64(b[:])>>16 + 1
	}
	if *out == "" {
		*out = filepath.Join("chaos-out", time.Now().Format("20060102-150405"))
	}
	bin, err := serverBinary(*binPath, *tier)
	if err != nil {
		return err
	}
	factory, err := chaos.NewFactory(*tier, chaos.FactoryOptions{Binary: bin})
	if err != nil {
		return &usageError{err.Error()}
	}
	fmt.Fprintf(stdout, "chaos: tier %s, seed %d, %d scenario(s) x %d run(s), output in %s\n", *tier, *seed, len(picked), *runs, *out)
	sc := chaos.SuiteConfig{Scenarios: picked, Seed: *seed, Runs: *runs, Dir: *out, Tier: *tier, New: factory, Out: stdout,
		Run: chaos.RunConfig{KeepData: *keep, Workload: chaos.WorkloadConfig{LeaseWorkers: *workers}}}
	if *timeLimit > 0 {
		sc.Deadline = time.Now().Add(*timeLimit)
	}
	res, err := chaos.RunSuite(ctx, sc)
	if err != nil {
		return err
	}
	if !res.Valid {
		return fmt.Errorf("a run failed its checks (see the table and %s)", filepath.Join(*out, "suite.json"))
	}
	return nil
}

// listScenarios prints the scenarios' table (--list).
func listScenarios(stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCLASS\tNODES\tDESCRIPTION")
	for _, s := range chaos.Scenarios() {
		n := cmp.Or(s.Nodes, 5)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.Name, s.Class, n, s.Doc)
	}
	return tw.Flush()
}

// pickScenarios reads --scenario: names, or "all" for every scenario but
// random.
func pickScenarios(names string) ([]*chaos.Scenario, error) {
	var picked []*chaos.Scenario
	switch names {
	case "all":
		for _, s := range chaos.Scenarios() {
			if s.Name != "random" {
				picked = append(picked, s)
			}
		}
	default:
		for _, name := range strings.Split(names, ",") {
			s, err := chaos.FindScenario(strings.TrimSpace(name))
			if err != nil {
				return nil, &usageError{err.Error()}
			}
			picked = append(picked, s)
		}
	}
	return picked, nil
}

// serverBinary is the leasehold binary the tier runs: --binary, or for the
// netns tier the leasehold next to this executable.
func serverBinary(binPath, tier string) (string, error) {
	bin := binPath
	if bin == "" && tier == "netns" {
		exe, err := os.Executable()
		if err != nil {
			return "", &usageError{"cannot find this executable: pass --binary"}
		}
		bin = filepath.Join(filepath.Dir(exe), "leasehold")
		if _, err := os.Stat(bin); err != nil {
			return "", &usageError{fmt.Sprintf("no leasehold server binary at %s: pass --binary", bin)}
		}
	}
	return bin, nil
}
