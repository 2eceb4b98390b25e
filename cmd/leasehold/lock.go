package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/recipe"
	"github.com/leasehold/leasehold/wire"
)

type lockOptions struct {
	holdOptions
	noWait bool
}

func (a *app) lockCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("lock", "KEY -- CMD [ARGS...]", "Take the lock KEY (waiting for it, as long as it takes, unless --no-wait or --wait),\n"+
		"run CMD while holding it, then release it: like 'etcdctl lock' and 'consul lock'. The lock is a\n"+
		"lease bound to a session that lock keeps alive (package recipe). With --limit N, KEY is a\n"+
		"semaphore of N slots. CMD gets LEASEHOLD_FENCING_TOKEN, LEASEHOLD_LEASE_ID, LEASEHOLD_KEY and\n"+
		"LEASEHOLD_SESSION_ID; if the session cannot be kept alive, CMD's group gets SIGTERM, then SIGKILL,\n"+
		"before the server could end it, and lock exits 1. Otherwise lock exits with CMD's status.")
	cf := newClientFlags(fs)
	holder := fs.String("holder", fmt.Sprintf("%s-%d", defaultHolder(), os.Getpid()), "holder name")
	ttl := fs.Duration("ttl", recipe.DefaultSessionTTL, "session TTL: how soon the lock is freed if lock dies")
	wait := fs.Duration("wait", 0, "give up after waiting this long (default: wait as long as it takes)")
	noWait := fs.Bool("no-wait", false, "fail at once if the lock is held")
	limit := fs.Uint("limit", 0, "slots of the key: a semaphore (default 1: a mutex)")
	verbose := fs.Bool("verbose", false, "report acquisition, heartbeat failures and release on stderr")
	pos, err := a.parse(fs, args, clientEnv(), 2)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageErrorf("usage: leasehold lock [flags] KEY -- CMD [ARGS...]")
	}
	if *ttl < minHoldTTL {
		return usageErrorf("--ttl must be at least %s (got %s)", minHoldTTL, *ttl)
	}
	if *limit > 1<<32-1 {
		return usageErrorf("--limit must be at most %d (got %d)", uint32(1<<32-1), *limit)
	}
	if *noWait && *wait > 0 {
		return usageErrorf("--no-wait and --wait exclude each other")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	return lockRun(ctx, c, lockOptions{holdOptions: holdOptions{
		key: pos[0], holder: *holder, ttl: *ttl, wait: *wait, limit: uint32(*limit),
		command: pos[1:], stdin: os.Stdin, stdout: a.stdout, stderr: a.stderr, verbose: *verbose, prog: "lock",
	}, noWait: *noWait}, sigs)
}

// errLeaseEnded stops lock's watch of its lease.
var errLeaseEnded = errors.New("lease ended")

// lockRun is lock after flag parsing (see holdRun for sigs and ctx).
func lockRun(ctx context.Context, c *client.Client, o lockOptions, sigs <-chan os.Signal) error {
	o.stdout, o.stderr = syncWriter(o.stdout), syncWriter(o.stderr)
	logf := func(format string, args ...any) {
		if o.verbose {
			fmt.Fprintf(o.stderr, "lock: "+format+"\n", args...)
		}
	}
	s, err := recipe.NewSession(ctx, c, recipe.SessionOptions{Holder: o.holder, TTL: o.ttl,
		KeepAlive: client.KeepAliveOptions{OnRenewError: func(err error) { logf("heartbeat failed (%v)", err) }}})
	if err != nil {
		return err
	}
	closeSession := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	}
	var lease func() *wire.Lease
	var lock, tryLock func(context.Context) error
	if o.limit > 1 {
		m := recipe.NewSemaphore(s, o.key, o.limit)
		lease, lock, tryLock = m.Lease, m.Acquire, m.TryAcquire
	} else {
		m := recipe.NewMutex(s, o.key)
		lease, lock, tryLock = m.Lease, m.Lock, m.TryLock
	}
	lctx, cancel := ctx, context.CancelFunc(func() {})
	if o.wait > 0 {
		lctx, cancel = context.WithTimeout(ctx, o.wait)
	}
	if o.noWait {
		err = tryLock(lctx)
	} else {
		err = lock(lctx)
	}
	cancel()
	if err != nil {
		closeSession()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("lock %s: still held by another holder after waiting %s", o.key, o.wait)
		}
		return err
	}
	l := lease()
	logf("locked %s (lease %s, fencing token %d, session %s)", o.key, l.LeaseID, l.FencingToken, s.ID())
	env := []string{
		"LEASEHOLD_FENCING_TOKEN=" + strconv.FormatUint(l.FencingToken, 10),
		"LEASEHOLD_LEASE_ID=" + l.LeaseID,
		"LEASEHOLD_KEY=" + o.key,
		"LEASEHOLD_SESSION_ID=" + s.ID(),
	}
	// The session's keep-alive cannot see the lock's lease end while the
	// session lives on (an operator's revoke): follow the key's events.
	ended := make(chan error, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		_ = c.Watch(wctx, client.WatchOptions{Key: o.key, FromStart: true}, func(ev wire.Event) error {
			if ev.Lease == nil || ev.Lease.LeaseID != l.LeaseID {
				return nil
			}
			switch ev.Type {
			case "released", "revoked", "expired":
				ended <- fmt.Errorf("lease %s %s: %s", l.LeaseID, ev.Type, ev.Reason)
				return errLeaseEnded
			}
			return nil
		})
	}()
	o.ended = ended
	// Ending the session when CMD is done releases the lock.
	return runUnder(ctx, s.KeepAlive(), o.holdOptions, env, sigs, logf)
}

func (a *app) keepAliveCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("keep-alive", "LEASE_ID | --session SESSION_ID", "Keep a standalone lease (with --lease-token) or a session (with --session and\n"+
		"--session-token) alive until interrupted, renewing it as the client's KeepAlive does. Exits 0\n"+
		"when interrupted (the lease or session is left to expire unless --release), 1 as soon as it is\n"+
		"lost: before the server could end it, counted from the send time of the last renewal.")
	cf := newClientFlags(fs)
	token := fs.String("lease-token", "", "the lease's token (env LEASEHOLD_LEASE_TOKEN)")
	session := fs.String("session", "", "keep this session alive instead of a lease")
	sessionToken := fs.String("session-token", "", "the session's token (env LEASEHOLD_SESSION_TOKEN)")
	release := fs.Bool("release", false, "release the lease (end the session) when interrupted")
	verbose := fs.Bool("verbose", false, "report renewal failures on stderr")
	pos, err := a.parse(fs, args, clientEnv("lease-token", "session-token"), 0)
	if err != nil {
		return err
	}
	switch {
	case *session == "" && len(pos) != 1:
		return usageErrorf("usage: leasehold keep-alive [flags] LEASE_ID, or --session SESSION_ID")
	case *session != "" && len(pos) != 0:
		return usageErrorf("keep-alive takes a LEASE_ID or --session, not both")
	case *session == "" && *token == "":
		return usageErrorf("keep-alive of a lease needs --lease-token or LEASEHOLD_LEASE_TOKEN")
	case *session != "" && *sessionToken == "":
		return usageErrorf("keep-alive of a session needs --session-token or LEASEHOLD_SESSION_TOKEN")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	opts := client.KeepAliveOptions{OnRenewError: func(err error) {
		if *verbose {
			fmt.Fprintf(a.stderr, "keep-alive: renewal failed (%v)\n", err)
		}
	}}
	ka, what, err := startKeepAlive(ctx, c, pos, *token, *session, *sessionToken, opts)
	if err != nil {
		return err
	}
	if *verbose {
		fmt.Fprintf(a.stderr, "keep-alive: keeping %s alive\n", what)
	}
	select {
	case <-ka.Lost():
		return &exitError{code: 1, msg: fmt.Sprintf("%s lost: %v", what, ka.Err())}
	case <-ctx.Done():
	}
	if !*release {
		ka.Stop()
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := ka.Release(rctx, "keep-alive: interrupted"); err != nil && !leaseGone(err) {
		return err
	}
	return nil
}

// startKeepAlive starts keeping the session (if session is set) or the lease
// pos[0] alive, after a first renewal that gives the TTL and a send time to
// count from; what names it for messages.
func startKeepAlive(ctx context.Context, c *client.Client, pos []string, token, session, sessionToken string,
	opts client.KeepAliveOptions) (ka *client.KeepAlive, what string, err error) {
	kctx := context.WithoutCancel(ctx)
	sent := time.Now()
	if session != "" {
		what = "session " + session
		s, err := c.SessionHeartbeat(ctx, session, sessionToken)
		if err != nil {
			return nil, what, err
		}
		s.Token = sessionToken
		ka, err = c.KeepAliveSession(kctx, s, sent, opts)
		return ka, what, err
	}
	what = "lease " + pos[0]
	l, err := c.Renew(ctx, pos[0], token, 0)
	if err != nil {
		return nil, what, err
	}
	l.Token = token
	ka, err = c.KeepAlive(kctx, l, sent, opts)
	return ka, what, err
}
