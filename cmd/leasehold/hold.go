package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// minHoldTTL is the smallest --ttl: the keep-alive's safety margin (at
// least client.MinMargin) must leave room for renewals.
const minHoldTTL = 3 * client.MinMargin

// leaseGone reports whether an error means the lease no longer exists for
// this holder.
func leaseGone(err error) bool {
	switch client.ErrorCode(err) {
	case wire.CodeLeaseExpired, wire.CodeLeaseReleased, wire.CodeLeaseRevoked,
		wire.CodeLeaseNotFound, wire.CodeLeaseTokenInvalid, wire.CodeSessionEnded:
		return true
	}
	return false
}

type holdOptions struct {
	key, holder    string
	ttl, wait      time.Duration
	limit          uint32
	command        []string
	stdin          io.Reader
	stdout, stderr io.Writer
	verbose        bool
	prog           string // in messages; "" means "hold"
	// grantFile, if set: the lease's current grant is written there
	// (atomically: a temporary file renamed over it) when acquired and
	// at each renewal, and the file is removed when hold ends.
	grantFile string
	// ended, if set, reports that the lease ended on the server although
	// its keep-alive did not notice (a lease bound to a session that an
	// operator revoked): the command is stopped as for a loss.
	ended <-chan error
}

func (a *app) holdCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("hold", "KEY -- CMD [ARGS...]", "Acquire a lease on KEY, run CMD while keeping it renewed, then release it.\n"+
		"CMD gets LEASEHOLD_FENCING_TOKEN, LEASEHOLD_LEASE_ID and LEASEHOLD_KEY in its environment and runs\n"+
		"in its own process group. If the lease cannot be renewed in time, CMD's group gets SIGTERM, then\n"+
		"SIGKILL, before the lease can expire, and hold exits 1. SIGINT and SIGTERM are forwarded to CMD.\n"+
		"Otherwise hold exits with CMD's status. With --grant-file PATH, PATH holds the lease's current\n"+
		"grant (rewritten atomically at each renewal; LEASEHOLD_GRANT_FILE names it) for CMD to present.")
	cf := newClientFlags(fs)
	holder := fs.String("holder", fmt.Sprintf("%s-%d", defaultHolder(), os.Getpid()), "holder name")
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL; renewed every TTL/3")
	wait := fs.Duration("wait", 0, "wait up to this long for the lease")
	limit := fs.Uint("limit", 0, "slots of the key (default 1: exclusive)")
	verbose := fs.Bool("verbose", false, "report acquisition, renewal failures and release on stderr")
	grantFile := fs.String("grant-file", "", "write the lease's signed grant to this file when acquired and at each renewal (atomically), for CMD to present to a resource; removed when hold ends")
	pos, err := a.parse(fs, args, clientEnv(), 2)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageErrorf("usage: leasehold hold [flags] KEY -- CMD [ARGS...]")
	}
	if *ttl < minHoldTTL {
		return usageErrorf("--ttl must be at least %s", minHoldTTL)
	}
	if *limit > 1<<32-1 {
		return usageErrorf("--limit too large")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	return holdRun(ctx, c, holdOptions{
		key: pos[0], holder: *holder, ttl: *ttl, wait: *wait, limit: uint32(*limit),
		command: pos[1:], stdin: os.Stdin, stdout: a.stdout, stderr: a.stderr, verbose: *verbose,
		grantFile: *grantFile,
	}, sigs)
}

// holdRun is hold after flag parsing. sigs delivers the signals to forward
// to the command. A cancelled ctx whose cause is not a signal (those arrive
// on sigs) is forwarded as SIGTERM.
//
// The lease is acquired and kept alive by the client's KeepAlive
// (AcquireKeepAlive): its Lost closes a safety margin before the server
// could end the lease, counted from the send time of the last successful
// renewal. Then the command's group gets SIGTERM, and SIGKILL half a margin
// later, still before the earliest expiry.
func holdRun(ctx context.Context, c *client.Client, o holdOptions, sigs <-chan os.Signal) error {
	// The command's output may be copied by exec's goroutines while hold
	// writes its own messages.
	o.stdout, o.stderr = syncWriter(o.stdout), syncWriter(o.stderr)
	logf := func(format string, args ...any) {
		if o.verbose {
			fmt.Fprintf(o.stderr, "hold: "+format+"\n", args...)
		}
	}
	req := wire.AcquireRequest{
		Key: o.key, Holder: o.holder, TTLMS: millis(o.ttl), Limit: o.limit,
		WaitMS: millis(o.wait), IdempotencyKey: "hold-" + randomID(16), Grant: o.grantFile != "",
	}
	kopts := client.KeepAliveOptions{
		OnRenewError: func(err error) { logf("renewal failed (%v)", err) },
	}
	var grantErr error // the first grant file write's error (before the command starts)
	if o.grantFile != "" {
		first := true
		kopts.Grant = true
		kopts.OnRenew = func(l *wire.Lease) {
			err := writeGrantFile(o.grantFile, l.Grant)
			if first {
				grantErr, first = err, false
			} else if err != nil {
				fmt.Fprintf(o.stderr, "%s: grant file: %v\n", progName(o.prog), err)
			}
		}
		defer os.Remove(o.grantFile)
	}
	ka, err := keepAliveUntilDone(ctx, func(kctx context.Context) (*client.KeepAlive, error) {
		return c.AcquireKeepAlive(kctx, req, kopts)
	})
	if err != nil {
		return err
	}
	if grantErr != nil {
		releaseHeld(ctx, ka, o.stderr, progName(o.prog), "hold: grant file not written", 5*time.Second, logf)
		return fmt.Errorf("grant file: %w", grantErr)
	}
	logf("acquired %s (lease %s, fencing token %d)", o.key, ka.LeaseID(), ka.FencingToken())
	env := []string{
		"LEASEHOLD_FENCING_TOKEN=" + strconv.FormatUint(ka.FencingToken(), 10),
		"LEASEHOLD_LEASE_ID=" + ka.LeaseID(),
		"LEASEHOLD_KEY=" + o.key,
	}
	if o.grantFile != "" {
		env = append(env, "LEASEHOLD_GRANT_FILE="+o.grantFile)
	}
	return runUnder(ctx, ka, o, env, sigs, logf)
}

// keepAliveUntilDone starts a keep-alive with start, whose context ctx
// bounds only until the keep-alive has started: after that, cancelling ctx
// stops the command (the caller forwards it), not the keep-alive, which
// must last until the command is gone.
func keepAliveUntilDone(ctx context.Context, start func(context.Context) (*client.KeepAlive, error)) (*client.KeepAlive, error) {
	kctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	started := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			cancel(context.Cause(ctx))
		case <-started:
		}
	}()
	ka, err := start(kctx)
	close(started)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	if kctx.Err() != nil {
		// ctx ended just as the keep-alive started.
		_ = ka.Release(context.WithoutCancel(ctx), "cancelled")
		return nil, context.Cause(kctx)
	}
	return ka, nil
}

// runUnder runs o.command while ka keeps its lease (or session) alive, stops
// it when ka is lost, and releases ka when the command is done. env is added
// to the command's environment.
func runUnder(ctx context.Context, ka *client.KeepAlive, o holdOptions, env []string, sigs <-chan os.Signal, logf func(string, ...any)) error {
	prog := cmp.Or(o.prog, "hold")
	release := func(reason string, timeout time.Duration) {
		releaseHeld(ctx, ka, o.stderr, prog, reason, timeout, logf)
	}

	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.stdin, o.stdout, o.stderr
	cmd.Env = append(os.Environ(), env...)
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		release(prog+": command did not start", 5*time.Second)
		return &exitError{code: 127, msg: err.Error()}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// stopping tells why the lease is given up and asks the command to stop.
	stopping := func(lost error) {
		fmt.Fprintf(o.stderr, "%s: lease on %s lost (%v): stopping %s\n", prog, o.key, lost, o.command[0])
		_ = signalGroup(cmd.Process, syscall.SIGTERM)
	}

	lostC, endedC := ka.Lost(), o.ended
	var killTimer <-chan time.Time
	var lost error // why the lease was given up; the command is being stopped
	ctxDone := ctx.Done()
	for {
		select {
		case err := <-exited:
			if lost != nil {
				// Nothing of the group may outlive the lease.
				_ = signalGroup(cmd.Process, syscall.SIGKILL)
				release(prog+": lease lost", time.Second)
				return &exitError{code: 1, msg: fmt.Sprintf("lease on %s lost: %v; command stopped", o.key, lost)}
			}
			release("", 5*time.Second)
			return exitStatus(err)

		case sig := <-sigs:
			logf("forwarding %v", sig)
			_ = signalGroup(cmd.Process, sig)

		case <-ctxDone:
			ctxDone = nil
			if cause := context.Cause(ctx); cause == context.Canceled || cause == context.DeadlineExceeded {
				_ = signalGroup(cmd.Process, syscall.SIGTERM)
			}

		case <-lostC:
			lostC = nil
			lost = ka.Err()
			stopping(lost)
			// Half the margin after the deadline: still before the
			// earliest instant the server could end the lease.
			grace := client.DefaultMargin(o.ttl) / 2
			killTimer = time.After(time.Until(ka.Deadline().Add(grace)))

		case err := <-endedC:
			endedC = nil
			if lost != nil {
				continue
			}
			lost = err
			stopping(lost)
			// Another holder may already have it: no more than half the
			// margin for the command to stop.
			killTimer = time.After(client.DefaultMargin(o.ttl) / 2)

		case <-killTimer:
			killTimer = nil
			_ = signalGroup(cmd.Process, syscall.SIGKILL)
		}
	}
}

// releaseHeld gives ka's lease back; after a loss the caller gives it only
// briefly, as the lease is most likely gone or the cluster unreachable.
func releaseHeld(ctx context.Context, ka *client.KeepAlive, stderr io.Writer, prog, reason string, timeout time.Duration, logf func(string, ...any)) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := ka.Release(rctx, reason); err != nil && !leaseGone(err) {
		fmt.Fprintf(stderr, "%s: release %s: %v (it expires by itself)\n", prog, ka.LeaseID(), err)
		return
	}
	logf("released %s", ka.LeaseID())
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// syncWriter makes w safe for concurrent writes. Files are (each write is
// one system call), and exec hands them to the command directly.
func syncWriter(w io.Writer) io.Writer {
	if _, ok := w.(*os.File); ok || w == nil {
		return w
	}
	return &lockedWriter{w: w}
}

// exitStatus turns the command's Wait error into hold's result: nil for
// status 0, its exit status, or 128+N for a command killed by signal N.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &exitError{code: 128 + int(ws.Signal())}
	}
	return &exitError{code: ee.ExitCode()}
}

// progName is prog, or "hold" when empty.
func progName(prog string) string {
	if prog == "" {
		return "hold"
	}
	return prog
}

// writeGrantFile replaces path with grant (and a newline) atomically: a
// temporary file in the same directory (mode 0600), synced, then renamed
// over path, so that a reader sees the previous grant or the new one,
// never a part. An empty grant is an error (the server gave none).
func writeGrantFile(path, grant string) error {
	if grant == "" {
		return errors.New("the answer carried no grant")
	}
	dir, base := filepath.Split(path)
	dir = cmp.Or(dir, ".")
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.WriteString(grant + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
