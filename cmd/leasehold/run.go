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
)

// app is what every subcommand runs with: its output streams and where it
// reads the environment (os.LookupEnv, or a map in tests).
type app struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// json is set when the command runs with --json: its errors are then
	// printed as JSON too.
	json bool
	// global holds the client flags given before the subcommand, applied
	// by parse to the subcommand's flags.
	global [][2]string
	// flagSets, when set, collects every flag set the commands make
	// (completion.go reads the commands' flags so).
	flagSets *[]*flag.FlagSet
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
		{"grant", "print a signed grant of a lease, as its holder", (*app).grantCmd},
		{"verify", "verify a grant offline against the cluster's keys", (*app).verifyCmd},
		{"keys", "print the cluster's grant verification keys", (*app).keysCmd},
		{"session", "create|get|list|heartbeat|end sessions", (*app).sessionCmd},
		{"holder-release", "end every lease and session of a holder (admin)", (*app).holderReleaseCmd},
		{"cluster", "status|members|remove|transfer-leadership", (*app).clusterCmd},
		{"snapshot", "save|restore|inspect a snapshot of the whole state (admin)", (*app).snapshotCmd},
		{"hold", "run a command while holding a lease", (*app).holdCmd},
		{"lock", "run a command while holding a lock (or a semaphore slot), waiting for it", (*app).lockCmd},
		{"keep-alive", "keep a lease or a session alive until interrupted", (*app).keepAliveCmd},
		{"bench", "benchmark a running node", (*app).benchCmd},
		{"token", "create a bearer token for the tokens file", (*app).tokenCmd},
		{"data", "offline, on a stopped server's data dir: migrate-log, recover (lost quorum), export-snapshot", (*app).dataCmd},
		{"health", "check that a node is ready (for container health checks)", (*app).healthCmd},
		{"keygen", "print a fresh random sealing (or gossip) key", (*app).keygenCmd},
		{"completion", "print a bash or zsh completion script", (*app).completionCmd},
		{"version", "print the version", (*app).versionCmd},
	}
}

// run runs the leasehold command line args (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := &app{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv}
	return a.run(ctx, args)
}

// run runs one command line. An error of a command run with --json comes
// back marked for report to print as JSON.
func (a *app) run(ctx context.Context, args []string) error {
	a.json = jsonRequested(args)
	err := a.dispatch(ctx, args)
	if err != nil {
		err = inUserUnits(err, args)
		if a.json {
			err = &jsonErrors{err}
		}
	}
	return err
}

func (a *app) dispatch(ctx context.Context, args []string) error {
	if len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "-h", "-help", "--help", "-version", "--version":
		default:
			// Client flags before the subcommand.
			set, rest, err := globalFlags(args)
			if err != nil {
				return err
			}
			a.global, args = set, rest
		}
	}
	if len(args) == 0 {
		if a.json {
			return usageErrorf("no command given (run 'leasehold help')")
		}
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
	var names []string
	for _, c := range commands() {
		if c.name == name {
			return c.run(a, ctx, args[1:])
		}
		names = append(names, c.name)
	}
	if s := suggest(name, append(names, "help")); s != "" {
		return usageErrorf("unknown command %q: did you mean %q? (run 'leasehold help')", name, s)
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
	fmt.Fprint(w, "\nRun 'leasehold COMMAND -h' for a command's flags. Client flags (--addr,\n"+
		"--token, --json, --timeout, --tls-*) may also come before COMMAND. Client\n"+
		"commands read LEASEHOLD_ADDR, LEASEHOLD_TOKEN and LEASEHOLD_CLIENT_CA,\n"+
		"_CERT, _KEY (--tls-*); server flags read LEASEHOLD_<FLAG>. Exit status:\n"+
		"0 ok, 1 failure, 2 usage or bad input, 3 held or busy, 4 not found or\n"+
		"ended, 5 no leader or unreachable, 6 not authorized, 130 interrupted\n"+
		"(docs/cli.md).\n")
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
	if a.flagSets != nil {
		*a.flagSets = append(*a.flagSets, fs)
	}
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: leasehold %s [flags] %s\n\n%s\n", name, argsUsage, desc)
		fmt.Fprintln(w, "\nflags:")
		fs.PrintDefaults()
	}
	return fs
}

// envVar is the environment variable a flag reads: name, or, when no
// variable of its set with an old name has its new name set, the
// deprecated old name, with a warning.
type envVar struct {
	flag, name, old string
}

// envVars are the LEASEHOLD_<FLAG> variables of flags.
func envVars(flags ...string) []envVar {
	vars := make([]envVar, len(flags))
	for i, f := range flags {
		vars[i] = envVar{flag: f, name: envName(f)}
	}
	return vars
}

// parse fills fs from the environment (the variables of env; see envVar),
// then from args, so that flags win over the environment. Flags and
// positional arguments may be interleaved; "--" ends the flags, and so
// does reaching maxPos positional arguments (0: no limit), after which the
// remaining arguments are returned verbatim. A deprecated variable that
// set a flag that args did not set again is reported on stderr.
func (a *app) parse(fs *flag.FlagSet, args []string, env []envVar, maxPos int) ([]string, error) {
	renamedSet := false // a renamed variable is set under its new name
	for _, e := range env {
		if v, ok := a.lookupEnv(e.name); e.old != "" && ok && v != "" {
			renamedSet = true
		}
	}
	type fallback struct {
		e envVar
		v string
	}
	var fallbacks []fallback
	for _, e := range env {
		name := e.name
		v, ok := a.lookupEnv(name)
		if (!ok || v == "") && e.old != "" && !renamedSet {
			name = e.old
			if v, ok = a.lookupEnv(name); ok && v != "" {
				fallbacks = append(fallbacks, fallback{e, v})
			}
		}
		if !ok || v == "" {
			continue
		}
		if err := fs.Set(e.flag, v); err != nil {
			return nil, usageErrorf("%s=%q: %v", name, v, err)
		}
	}
	for _, g := range a.global {
		if fs.Lookup(g[0]) == nil {
			return nil, usageErrorf("--%s (given before the command) does not apply to %s", g[0], fs.Name())
		}
		if err := fs.Set(g[0], g[1]); err != nil {
			return nil, usageErrorf("--%s %q: %v", g[0], g[1], err)
		}
	}
	pos, err := a.parseArgs(fs, args, maxPos)
	if err != nil {
		return nil, err
	}
	for _, f := range fallbacks {
		if fs.Lookup(f.e.flag).Value.String() == f.v {
			fmt.Fprintf(a.stderr, "warning: %s is deprecated for client commands (a server reads it as its own --%s); set %s instead\n",
				f.e.old, f.e.flag, f.e.name)
		}
	}
	return pos, nil
}

// parseArgs parses args into fs, as parse describes.
func (a *app) parseArgs(fs *flag.FlagSet, args []string, maxPos int) ([]string, error) {
	var pos []string
	for {
		if err := a.parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if f := fs.Lookup("json"); f != nil {
			a.json = f.Value.String() == "true"
		}
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

// parseFlags is fs.Parse(args). Under --json a bad flag comes back as a
// usage error (printed as JSON) instead of the flag package's text.
func (a *app) parseFlags(fs *flag.FlagSet, args []string) error {
	if !a.json {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsageShown
		}
		return nil
	}
	out := fs.Output()
	var buf strings.Builder
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(out, buf.String())
		return err
	case err != nil:
		return usageErrorf("%s: %v", fs.Name(), err)
	}
	return nil
}

// allFlags lists the names of every flag of fs.
func allFlags(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}
