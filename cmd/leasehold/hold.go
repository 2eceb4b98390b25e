package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
)

// holdDeadline is the holder's own, conservative view of its lease. The
// server counts a TTL from when it applies a renewal, which is after the
// holder sent it, and a tick never runs faster than real time; so the lease
// cannot end before (send time of the last successful renewal + TTL). The
// holder stops its command a margin before that instant and kills it half
// a margin before, so that the command is gone before anyone else can be
// granted the lease. All times carry the monotonic clock reading of
// time.Now, so wall-clock jumps do not move them.
type holdDeadline struct {
	margin time.Duration // stop the command this long before expiry
	grace  time.Duration // from SIGTERM to SIGKILL; less than margin
	expiry time.Time     // earliest possible server-side expiry
}

// minHoldMargin is the smallest safety margin: scheduling, signal delivery
// and process exit must fit into it.
const minHoldMargin = 100 * time.Millisecond

func newHoldDeadline(ttl time.Duration) holdDeadline {
	margin := max(ttl/10, minHoldMargin)
	margin = min(margin, ttl/2)
	return holdDeadline{margin: margin, grace: margin / 2}
}

// renewed records a successful acquire or renewal sent at sent whose lease
// then had at least ttl left. An answer about an earlier request never moves
// the deadline back.
func (d *holdDeadline) renewed(sent time.Time, ttl time.Duration) {
	if e := sent.Add(ttl); e.After(d.expiry) {
		d.expiry = e
	}
}

// stopAt is when the command gets SIGTERM unless a renewal succeeds first.
func (d holdDeadline) stopAt() time.Time { return d.expiry.Add(-d.margin) }

// killAt is when a command that ignored SIGTERM gets SIGKILL; still before
// the earliest expiry.
func (d holdDeadline) killAt() time.Time { return d.stopAt().Add(d.grace) }

// expired reports whether the command must be stopped at now.
func (d holdDeadline) expired(now time.Time) bool { return !now.Before(d.stopAt()) }

// grantedTTL is what a renewal answer guarantees from its send time: the
// requested TTL, or less if the server reports less remaining.
func grantedTTL(ttl time.Duration, l *node.Lease) time.Duration {
	if l != nil && l.RemainingMS > 0 {
		return min(ttl, time.Duration(l.RemainingMS)*time.Millisecond)
	}
	return ttl
}

// renewInterval is the period of renewals: the lease's suggested heartbeat
// interval, else TTL/3.
func renewInterval(ttl time.Duration, l *node.Lease) time.Duration {
	if l != nil && l.HeartbeatIntervalMS > 0 {
		return min(time.Duration(l.HeartbeatIntervalMS)*time.Millisecond, ttl/3)
	}
	return ttl / 3
}

// retryInterval is how soon a failed renewal is retried.
func retryInterval(interval time.Duration) time.Duration {
	return min(max(interval/4, 50*time.Millisecond), time.Second)
}

// leaseGone reports whether a renewal error means the lease no longer
// exists for this holder (no point in retrying).
func leaseGone(err error) bool {
	switch client.ErrorCode(err) {
	case node.CodeLeaseExpired, node.CodeLeaseReleased, node.CodeLeaseRevoked,
		node.CodeLeaseNotFound, node.CodeLeaseTokenInvalid, node.CodeSessionEnded:
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
}

func (a *app) holdCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("hold", "KEY -- CMD [ARGS...]", "Acquire a lease on KEY, run CMD while keeping it renewed, then release it.\n"+
		"CMD gets LEASEHOLD_FENCING_TOKEN, LEASEHOLD_LEASE_ID and LEASEHOLD_KEY in its environment and runs\n"+
		"in its own process group. If the lease cannot be renewed in time, CMD's group gets SIGTERM, then\n"+
		"SIGKILL, before the lease can expire, and hold exits 1. SIGINT and SIGTERM are forwarded to CMD.\n"+
		"Otherwise hold exits with CMD's status.")
	var cf clientFlags
	cf.register(fs)
	holder := fs.String("holder", fmt.Sprintf("%s-%d", defaultHolder(), os.Getpid()), "holder name")
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL; renewed every TTL/3")
	wait := fs.Duration("wait", 0, "wait up to this long for the lease")
	limit := fs.Uint("limit", 0, "slots of the key (default 1: exclusive)")
	verbose := fs.Bool("verbose", false, "report acquisition, renewal failures and release on stderr")
	pos, err := a.parse(fs, args, clientEnv(), 2)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageErrorf("usage: leasehold hold [flags] KEY -- CMD [ARGS...]")
	}
	if *ttl < 3*minHoldMargin {
		return usageErrorf("--ttl must be at least %s", 3*minHoldMargin)
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
	}, sigs)
}

type renewResult struct {
	sent  time.Time
	lease *node.Lease
	err   error
}

// holdRun is hold after flag parsing. sigs delivers the signals to forward
// to the command. A cancelled ctx whose cause is not a signal (those arrive
// on sigs) is forwarded as SIGTERM.
func holdRun(ctx context.Context, c *client.Client, o holdOptions, sigs <-chan os.Signal) error {
	// The command's output may be copied by exec's goroutines while hold
	// writes its own messages.
	o.stdout, o.stderr = syncWriter(o.stdout), syncWriter(o.stderr)
	logf := func(format string, args ...any) {
		if o.verbose {
			fmt.Fprintf(o.stderr, "hold: "+format+"\n", args...)
		}
	}
	req := node.AcquireRequest{
		Key: o.key, Holder: o.holder, TTLMS: millis(o.ttl), Limit: o.limit,
		WaitMS: millis(o.wait), IdempotencyKey: "hold-" + randomID(16),
	}
	sent := time.Now()
	lease, err := c.Acquire(ctx, req)
	if err != nil {
		return err
	}
	dl := newHoldDeadline(o.ttl)
	dl.renewed(sent, grantedTTL(o.ttl, lease))
	interval := renewInterval(o.ttl, lease)
	logf("acquired %s (lease %s, fencing token %d)", o.key, lease.LeaseID, lease.FencingToken)

	// release gives the lease back; after a loss it tries only briefly, as
	// the lease is most likely gone or the cluster unreachable.
	release := func(reason string, timeout time.Duration) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		_, err := c.Release(rctx, node.ReleaseRequest{LeaseID: lease.LeaseID, Token: lease.Token, Reason: reason})
		if err != nil && !leaseGone(err) {
			fmt.Fprintf(o.stderr, "hold: release %s: %v (it expires by itself)\n", lease.LeaseID, err)
			return
		}
		logf("released %s", lease.LeaseID)
	}

	// A long wait for the lease may have eaten into the first TTL: renew
	// once before starting the command.
	if time.Until(dl.stopAt()) < o.ttl/2 {
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, dl.stopAt())
		l, err := c.Renew(rctx, lease.LeaseID, lease.Token, 0)
		cancel()
		if err != nil || l.State != "active" {
			release("hold: could not renew before starting", time.Second)
			return fmt.Errorf("lease on %s acquired but not renewable in time: %v", o.key, err)
		}
		dl.renewed(sent, grantedTTL(o.ttl, l))
	}

	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.stdin, o.stdout, o.stderr
	cmd.Env = append(os.Environ(),
		"LEASEHOLD_FENCING_TOKEN="+strconv.FormatUint(lease.FencingToken, 10),
		"LEASEHOLD_LEASE_ID="+lease.LeaseID,
		"LEASEHOLD_KEY="+o.key,
	)
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		release("hold: command did not start", 5*time.Second)
		return &exitError{code: 127, msg: err.Error()}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	renewTimer := time.NewTimer(time.Until(sent.Add(interval)))
	defer renewTimer.Stop()
	stopTimer := time.NewTimer(time.Until(dl.stopAt()))
	defer stopTimer.Stop()
	var killTimer <-chan time.Time
	renewed := make(chan renewResult, 1)
	renewing := false
	var lost error // why the lease was given up; the command is being stopped
	ctxDone := ctx.Done()

	loseLease := func(why error) {
		if lost != nil {
			return
		}
		lost = why
		fmt.Fprintf(o.stderr, "hold: lease on %s lost (%v): stopping %s\n", o.key, why, o.command[0])
		_ = signalGroup(cmd.Process, syscall.SIGTERM)
		killTimer = time.After(time.Until(dl.killAt()))
		renewTimer.Stop()
		stopTimer.Stop()
	}

	for {
		select {
		case err := <-exited:
			if lost != nil {
				// Nothing of the group may outlive the lease.
				_ = signalGroup(cmd.Process, syscall.SIGKILL)
				release("hold: lease lost", time.Second)
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

		case <-renewTimer.C:
			if lost != nil || renewing {
				continue
			}
			renewing = true
			// Give up on an attempt after one interval, so that a node that
			// hangs leaves time to retry (on the next address).
			sent := time.Now()
			deadline := sent.Add(interval)
			if stop := dl.stopAt(); stop.Before(deadline) {
				deadline = stop
			}
			go func() {
				rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
				defer cancel()
				l, err := c.Renew(rctx, lease.LeaseID, lease.Token, 0)
				renewed <- renewResult{sent, l, err}
			}()

		case r := <-renewed:
			renewing = false
			if lost != nil {
				continue
			}
			switch {
			case r.err == nil && r.lease.State == "active":
				dl.renewed(r.sent, grantedTTL(o.ttl, r.lease))
				stopTimer.Reset(time.Until(dl.stopAt()))
				renewTimer.Reset(time.Until(r.sent.Add(interval)))
			case r.err == nil:
				loseLease(fmt.Errorf("lease is %s", r.lease.State))
			case leaseGone(r.err):
				loseLease(r.err)
			default:
				logf("renewal failed (%v); %s left before stopping", r.err, time.Until(dl.stopAt()).Round(time.Millisecond))
				renewTimer.Reset(retryInterval(interval))
			}

		case <-stopTimer.C:
			if lost == nil && dl.expired(time.Now()) {
				loseLease(errors.New("no successful renewal in time"))
			}

		case <-killTimer:
			killTimer = nil
			_ = signalGroup(cmd.Process, syscall.SIGKILL)
		}
	}
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
