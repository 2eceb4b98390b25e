package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// Exit statuses of every subcommand (docs/cli.md). hold and lock exit with
// their command's status once it ran.
const (
	exitOK          = 0
	exitFailure     = 1   // anything else: an internal error, a file that cannot be written, validate's "invalid"
	exitUsage       = 2   // bad command line or input the server refused (INVALID_ARGUMENT, ...)
	exitBusy        = 3   // held or busy: LEASE_HELD, LOCK_DELAY, RESOURCE_EXHAUSTED, ...
	exitNotFound    = 4   // no such lease or session, or it has ended
	exitUnavailable = 5   // no leader, no node reachable, or an outcome not known
	exitDenied      = 6   // not authenticated or not allowed, or a wrong lease token
	exitStorage     = 74  // server: its Raft log or term could not be written (a full or failing disk); restart it once the disk works (EX_IOERR)
	exitInterrupted = 130 // SIGINT or SIGTERM
)

// codeExit maps each contract error code to its exit status.
var codeExit = map[wire.Code]int{
	wire.CodeInvalidArgument:     exitUsage,
	wire.CodePayloadTooLarge:     exitUsage,
	wire.CodeIdempotencyConflict: exitUsage,
	wire.CodeMethodNotAllowed:    exitUsage,
	wire.CodeLeaseHeld:           exitBusy,
	wire.CodeLockDelay:           exitBusy,
	wire.CodeLimitMismatch:       exitBusy,
	wire.CodeResourceExhausted:   exitBusy,
	wire.CodeControlLocked:       exitBusy,
	wire.CodeLeaseRequired:       exitBusy,
	wire.CodeLeaseNotFound:       exitNotFound,
	wire.CodeSessionNotFound:     exitNotFound,
	wire.CodeNotFound:            exitNotFound,
	wire.CodeLeaseExpired:        exitNotFound,
	wire.CodeLeaseReleased:       exitNotFound,
	wire.CodeLeaseRevoked:        exitNotFound,
	wire.CodeSessionEnded:        exitNotFound,
	wire.CodeEventsCompacted:     exitNotFound,
	wire.CodeNoLeader:            exitUnavailable,
	wire.CodeUnavailable:         exitUnavailable,
	wire.CodeIndeterminate:       exitUnavailable,
	wire.CodeUnauthenticated:     exitDenied,
	wire.CodePermissionDenied:    exitDenied,
	wire.CodeLeaseTokenInvalid:   exitDenied,
}

// Codes of the --json error object for failures that are not a server's
// answer.
const (
	codeUsage       wire.Code = "USAGE"
	codeInterrupted wire.Code = "INTERRUPTED"
	codeFailed      wire.Code = "FAILED"
)

// failure is what report says about an error: the exit status, the error
// object (--json) and whether anything is to be printed at all.
type failure struct {
	status int
	err    wire.Error
	quiet  bool // already explained (flag usage) or deliberately silent
}

// classify turns err into its exit status and error object.
func classify(err error) failure {
	var ue *usageError
	var ee *exitError
	var ne *wire.Error
	switch {
	case errors.Is(err, errUsageShown):
		return failure{status: exitUsage, err: wire.Error{Code: codeUsage, Message: "usage"}, quiet: true}
	case errors.As(err, &ue):
		return failure{status: exitUsage, err: wire.Error{Code: codeUsage, Message: ue.msg}}
	case errors.As(err, &ee):
		return failure{status: ee.code, err: wire.Error{Code: codeFailed, Message: ee.msg}, quiet: ee.msg == ""}
	case errors.Is(err, context.Canceled):
		return failure{status: exitInterrupted, err: wire.Error{Code: codeInterrupted, Message: "interrupted"}}
	case errors.As(err, &ne):
		st, ok := codeExit[ne.Code]
		if !ok {
			st = exitFailure
		}
		return failure{status: st, err: *ne}
	case unreachable(err):
		return failure{status: exitUnavailable, err: wire.Error{Code: wire.CodeUnavailable, Message: err.Error()}}
	}
	return failure{status: exitFailure, err: wire.Error{Code: codeFailed, Message: err.Error()}}
}

// unreachable reports whether err is a transport failure: no node answered
// (refused, reset, DNS, TLS handshake) or none answered in time.
// (Not net.Error: a syscall.Errno is one, so a missing file would count.)
func unreachable(err error) bool {
	var ue *url.Error
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &ue) || errors.As(err, &oe) || errors.As(err, &de) || errors.Is(err, context.DeadlineExceeded)
}

// jsonErrors marks an error of a command run with --json: report prints it
// as a JSON object.
type jsonErrors struct{ err error }

func (e *jsonErrors) Error() string { return e.err.Error() }
func (e *jsonErrors) Unwrap() error { return e.err }

// errorJSON is the object printed on stderr for a failure under --json: the
// API's error envelope (code, message and the code's details) plus the
// exit status.
type errorJSON struct {
	Error struct {
		wire.Error
		ExitStatus int `json:"exit_status"`
	} `json:"error"`
}

// report prints err the way the command line promises (docs/cli.md) and
// returns the exit status: a line "error: ..." on stderr, or under --json
// one JSON object {"error": {...}} on stderr.
func report(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	f := classify(err)
	var je *jsonErrors
	if errors.As(err, &je) {
		if f.err.Message != "" || !f.quiet {
			var out errorJSON
			out.Error.Error, out.Error.ExitStatus = f.err, f.status
			_ = json.NewEncoder(stderr).Encode(out) // one line

		}
		return f.status
	}
	if f.quiet {
		return f.status
	}
	var ne *wire.Error
	if errors.As(err, &ne) && !errors.As(err, new(*exitError)) {
		fmt.Fprintf(stderr, "error: %s\n", ne.Error())
		for _, h := range ne.Holders {
			fmt.Fprintf(stderr, "  held by %s (lease %s, %s left)\n", h.Holder, h.LeaseID, msString(h.RemainingMS))
		}
		if ne.Code == wire.CodeLockDelay && ne.RemainingMS > 0 {
			fmt.Fprintf(stderr, "  lock-delay ends in %s\n", msString(ne.RemainingMS))
		}
		return f.status
	}
	fmt.Fprintf(stderr, "error: %s\n", f.err.Message)
	return f.status
}

// jsonRequested guesses from the command line whether --json is set, for
// errors that happen before the flags are parsed (a parse error itself).
// Arguments after "--" are another program's.
func jsonRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-json", "--json", "-json=true", "--json=true":
			return true
		}
	}
	return false
}

// globalFlags parses the client flags given before the subcommand
// (leasehold --addr X --json get ID): they return as name=value pairs, which
// parse applies to the subcommand's flag set, and the rest of args.
func globalFlags(args []string) (set [][2]string, rest []string, err error) {
	fs := flag.NewFlagSet("leasehold", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	newClientFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, usageErrorf("%v (before the command, only the client flags: %s)", err, strings.Join(flagNames(fs), " "))
	}
	// Visit walks in name order; keep the command line's order instead so
	// that a repeated flag ends with its last value.
	seen := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { seen[f.Name] = true })
	for _, a := range args[:len(args)-len(fs.Args())] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if seen[name] {
			set = append(set, [2]string{name, fs.Lookup(name).Value.String()})
			delete(seen, name)
		}
	}
	return set, fs.Args(), nil
}

func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
	return names
}

// suggest returns the one candidate name is a prefix of, else the candidate
// closest to name if it is close enough to be a typo (at most two edits,
// fewer than name has letters); "" otherwise.
func suggest(name string, candidates []string) string {
	best, bestD := "", 3
	var prefixed []string
	for _, c := range candidates {
		if strings.HasPrefix(c, name) && name != "" {
			prefixed = append(prefixed, c)
		}
		if d := editDistance(name, c); d < bestD && d < len(name) {
			best, bestD = c, d
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent
// letters each count one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// durationFields names the duration flag behind each millisecond field of
// the API, for errors in the units the user typed.
var durationFields = map[string]string{
	"ttl_ms":        "ttl",
	"wait_ms":       "wait",
	"lock_delay_ms": "lock-delay",
}

// inUserUnits rewrites an INVALID_ARGUMENT about a millisecond field out of
// range that a duration flag set into the flag's terms: "ttl 25h exceeds
// the maximum 24h", from the error's bounds (its min and max, never its
// message). args is the command line the flag's text is looked up in;
// without it the message gives the range ("ttl must be 1s-24h"). Other
// errors return unchanged.
func inUserUnits(err error, args []string) error {
	var ne *wire.Error
	if !errors.As(err, &ne) || ne.Code != wire.CodeInvalidArgument {
		return err
	}
	flagName, ok := durationFields[ne.Field]
	if !ok {
		return err
	}
	lo, hi, ok := ne.Bounds()
	if !ok {
		return err
	}
	ms := func(n int64) string { return shortDuration(time.Duration(n) * time.Millisecond) }
	out := *ne
	typed := flagText(args, flagName)
	got, perr := time.ParseDuration(typed)
	switch {
	case typed != "" && perr == nil && got.Milliseconds() > hi:
		out.Message = fmt.Sprintf("%s %s exceeds the maximum %s", flagName, typed, ms(hi))
	case typed != "" && perr == nil && got.Milliseconds() < lo:
		out.Message = fmt.Sprintf("%s %s is below the minimum %s", flagName, typed, ms(lo))
	default:
		out.Message = fmt.Sprintf("%s must be %s-%s", flagName, ms(lo), ms(hi))
	}
	return &out
}

// flagText returns the text given to --name on the command line (its last
// occurrence before "--"), or "".
func flagText(args []string, name string) string {
	var v string
	for i, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		n, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if n != name {
			continue
		}
		if hasVal {
			v = val
		} else if i+1 < len(args) {
			v = args[i+1]
		}
	}
	return v
}

// shortDuration prints d without zero trailing units: 24h, 1h30m, 5m, 1.5s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
