package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/leasehold/leasehold/node"
)

// app is what every subcommand runs with: its output streams and where it
// reads the environment (os.LookupEnv, or a map in tests).
type app struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(a *app, ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"server", "run a Leasehold node", (*app).serverCmd},
		{"acquire", "acquire a lease", (*app).acquireCmd},
		{"renew", "renew a standalone lease", (*app).renewCmd},
		{"release", "release a lease", (*app).releaseCmd},
		{"revoke", "force-release a lease (admin)", (*app).revokeCmd},
		{"get", "show one lease", (*app).getCmd},
		{"list", "list leases", (*app).listCmd},
		{"watch", "stream lease and session events", (*app).watchCmd},
		{"validate", "check a fencing token or a lease token", (*app).validateCmd},
		{"session", "create|get|list|heartbeat|end sessions", (*app).sessionCmd},
		{"holder-release", "end every lease and session of a holder (admin)", (*app).holderReleaseCmd},
		{"cluster", "status|members|remove|transfer-leadership", (*app).clusterCmd},
		{"snapshot", "save|restore|inspect a snapshot of the whole state (admin)", (*app).snapshotCmd},
		{"hold", "run a command while holding a lease", (*app).holdCmd},
		{"bench", "benchmark a running node", (*app).benchCmd},
		{"chaos", "run the fault-injection suite against a cluster it starts", (*app).chaosCmd},
		{"token", "create a bearer token for the tokens file", (*app).tokenCmd},
		{"keygen", "print a fresh random sealing (or gossip) key", (*app).keygenCmd},
		{"version", "print the version", (*app).versionCmd},
	}
}

// run runs the leasehold command line args (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := &app{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		a.usage(a.stderr)
		return errUsageShown
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		a.usage(a.stdout)
		return nil
	case "-version", "--version":
		name = "version"
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(a, ctx, args[1:])
		}
	}
	return usageErrorf("unknown command %q (run 'leasehold help')", name)
}

func (a *app) usage(w io.Writer) {
	fmt.Fprint(w, "usage: leasehold COMMAND [flags] [args]\n\ncommands:\n")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprint(w, "\nRun 'leasehold COMMAND -h' for a command's flags. Client commands read\n"+
		"LEASEHOLD_ADDR and LEASEHOLD_TOKEN; server flags read LEASEHOLD_<FLAG>.\n")
}

// usageError is a command line the program cannot run: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// errUsageShown is a usage error whose explanation is already printed.
var errUsageShown = errors.New("usage shown")

// exitError ends the program with a given status; msg, if any, is printed
// as "error: msg".
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.msg
}

// report prints err the way the command line promises and returns the exit
// status: 0 on success, 2 for usage errors, 1 for other errors (an
// exitError chooses its own).
func report(err error, stderr io.Writer) int {
	var ue *usageError
	var ee *exitError
	var ne *node.Error
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsageShown):
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "error: %s\n", ue.msg)
		return 2
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintf(stderr, "error: %s\n", ee.msg)
		}
		return ee.code
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "error: interrupted")
		return 1
	case errors.As(err, &ne):
		fmt.Fprintf(stderr, "error: %s\n", ne.Error())
		for _, h := range ne.Holders {
			fmt.Fprintf(stderr, "  held by %s (lease %s, %s left)\n", h.Holder, h.LeaseID, msString(h.RemainingMS))
		}
		if ne.Code == node.CodeLockDelay && ne.RemainingMS > 0 {
			fmt.Fprintf(stderr, "  lock-delay ends in %s\n", msString(ne.RemainingMS))
		}
		return 1
	}
	fmt.Fprintf(stderr, "error: %s\n", err)
	return 1
}

// envName is the environment variable a flag reads: --http-addr ->
// LEASEHOLD_HTTP_ADDR.
func envName(flagName string) string {
	return "LEASEHOLD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet returns a flag set for one subcommand whose errors and usage go
// to stderr.
func (a *app) newFlagSet(name, argsUsage, desc string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: leasehold %s [flags] %s\n\n%s\n", name, argsUsage, desc)
		fmt.Fprintln(w, "\nflags:")
		fs.PrintDefaults()
	}
	return fs
}

// parse fills fs from the environment (for the flags named in envFlags,
// each from envName(flag)), then from args, so that flags win over the
// environment. Flags and positional arguments may be interleaved; "--" ends
// the flags, and so does reaching maxPos positional arguments (0: no
// limit), after which the remaining arguments are returned verbatim.
func (a *app) parse(fs *flag.FlagSet, args []string, envFlags []string, maxPos int) ([]string, error) {
	for _, name := range envFlags {
		v, ok := a.lookupEnv(envName(name))
		if !ok || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return nil, usageErrorf("%s=%q: %v", envName(name), v, err)
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsageShown
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
		if maxPos > 0 && len(pos) >= maxPos {
			return append(pos, args...), nil
		}
	}
}

// allFlags lists the names of every flag of fs.
func allFlags(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}
