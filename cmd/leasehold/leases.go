package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

func defaultHolder() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "leasehold-cli"
	}
	return h
}

func (a *app) acquireCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("acquire", "KEY [KEY...]", "Acquire a lease on KEY and print it with its secret token (shown only here). "+
		"With several KEYs, one lease on each in one request, all or nothing (a lease group: renew, release and get it by its lg_ id).")
	cf := newClientFlags(fs)
	holder := fs.String("holder", defaultHolder(), "holder name")
	ttl := fs.Duration("ttl", 30*time.Second, "TTL of a standalone lease")
	session := fs.String("session", "", "bind the lease to this session instead of a TTL")
	sessionToken := fs.String("session-token", "", "the session's token (env LEASEHOLD_SESSION_TOKEN)")
	limit := fs.Uint("limit", 0, "slots of the key (default 1: exclusive); with several KEYs, of each")
	keyLimits := keyLimitFlag{}
	fs.Var(keyLimits, "key-limit", "KEY=N: slots of one of several KEYs (repeatable)")
	wait := fs.Duration("wait", 0, "wait up to this long for a free slot")
	lockDelay := fs.Duration("lock-delay", 0, "keep the slot blocked this long after an involuntary end")
	idem := fs.String("idempotency-key", "", "idempotency key (default: a random one, so retries on other nodes are safe)")
	withGrant := fs.Bool("grant", false, "ask for a grant of the lease (a signed JWS a resource verifies offline; see 'leasehold verify')")
	md := metadataFlag{}
	fs.Var(md, "metadata", "metadata key=value (repeatable)")
	pos, err := a.parse(fs, args, clientEnv("session-token"), 0)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErrorf("acquire takes one KEY (or several, for a lease group)")
	}
	if *limit > 1<<32-1 {
		return usageErrorf("--limit too large")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	req := wire.AcquireRequest{
		Key:            pos[0],
		Holder:         *holder,
		SessionID:      *session,
		SessionToken:   *sessionToken,
		Limit:          uint32(*limit),
		WaitMS:         millis(*wait),
		LockDelayMS:    millis(*lockDelay),
		IdempotencyKey: *idem,
		Grant:          *withGrant,
	}
	if len(md) > 0 {
		req.Metadata = md
	}
	if req.SessionID == "" {
		req.TTLMS = millis(*ttl)
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = "cli-" + randomID(16)
	}
	if len(pos) > 1 || len(keyLimits) > 0 {
		return a.acquireGroup(ctx, c, cf.json, pos, req, keyLimits)
	}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, l, printLease)
}

func (a *app) renewCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("renew", "LEASE_ID", "Renew a standalone lease (every lease of a group, given its lg_ id).")
	cf := newClientFlags(fs)
	token := fs.String("lease-token", "", "the lease's token (env LEASEHOLD_LEASE_TOKEN)")
	ttl := fs.Duration("ttl", 0, "new TTL (default: keep the lease's)")
	withGrant := fs.Bool("grant", false, "ask for a grant of the renewed lease")
	id, err := a.parseOne(fs, args, "lease-token")
	if err != nil {
		return err
	}
	if *token == "" {
		return usageErrorf("renew needs --lease-token or LEASEHOLD_LEASE_TOKEN")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if isGroupID(id) {
		if *withGrant {
			return usageErrorf("--grant: a lease group's renewal carries no grants (renew without it)")
		}
		g, err := c.RenewGroup(ctx, id, *token, millis(*ttl))
		if err != nil {
			return err
		}
		return output(a.stdout, cf.json, g, printGroup)
	}
	l, err := c.RenewWith(ctx, wire.RenewRequest{LeaseID: id, Token: *token, TTLMS: millis(*ttl), Grant: *withGrant})
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, l, printLease)
}

func (a *app) releaseCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("release", "LEASE_ID", "Release a lease with its lease token (or, if bound to a session, the session token); "+
		"every lease of a group, given its lg_ id.")
	cf := newClientFlags(fs)
	token := fs.String("lease-token", "", "the lease's token (env LEASEHOLD_LEASE_TOKEN)")
	sessionToken := fs.String("session-token", "", "the session's token, for a bound lease (env LEASEHOLD_SESSION_TOKEN)")
	reason := fs.String("reason", "", "why (kept as the lease's end_reason)")
	id, err := a.parseOne(fs, args, "lease-token", "session-token")
	if err != nil {
		return err
	}
	if *token == "" && *sessionToken == "" {
		return usageErrorf("release needs --lease-token or --session-token")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if isGroupID(id) {
		g, err := c.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: id, Token: *token, SessionToken: *sessionToken, Reason: *reason})
		if err != nil {
			return err
		}
		return printOr(a.stdout, cf.json, g, "released "+id, printGroup)
	}
	l, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: id, Token: *token, SessionToken: *sessionToken, Reason: *reason})
	if err != nil {
		return err
	}
	return printOr(a.stdout, cf.json, l, "released "+id, printLease)
}

func (a *app) revokeCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("revoke", "LEASE_ID", "Force-release a lease as an operator (admin scope).")
	cf := newClientFlags(fs)
	reason := fs.String("reason", "", "why (kept as the lease's end_reason)")
	id, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	l, err := c.Revoke(ctx, id, *reason)
	if err != nil {
		return err
	}
	return printOr(a.stdout, cf.json, l, "revoked "+id, printLease)
}

func (a *app) getCmd(ctx context.Context, args []string) error {
	return showOne(a, ctx, args, "get", "LEASE_ID", "Show one lease (or lease group, by its lg_ id), in any state still retained.",
		getLeaseOrGroup, printLeaseOrGroup)
}

// showOne is a command that reads one object by id and prints it.
func showOne[T any](a *app, ctx context.Context, args []string, name, arg, help string,
	get func(*client.Client, context.Context, string) (T, error), print func(io.Writer, T) error) error {
	fs := a.newFlagSet(name, arg, help)
	cf := newClientFlags(fs)
	stale := fs.Bool("stale", false, "answer from the contacted node, not through the leader")
	id, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	c, err := cf.staleClient(*stale)
	if err != nil {
		return err
	}
	v, err := get(c, ctx, id)
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, v, print)
}

func (a *app) listCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("list", "", "List leases. Filters combine; --all follows the pages to the end.")
	cf := newClientFlags(fs)
	var req wire.ListRequest
	fs.StringVar(&req.Key, "key", "", "only this key")
	fs.StringVar(&req.Prefix, "prefix", "", "only keys with this prefix")
	fs.StringVar(&req.Holder, "holder", "", "only this holder")
	fs.StringVar(&req.SessionID, "session", "", "only leases bound to this session")
	fs.StringVar(&req.State, "state", "", "only this state (active, released, expired, revoked)")
	fs.StringVar(&req.After, "after", "", "start after this cursor")
	fs.IntVar(&req.Limit, "limit", 0, "page size (server default 100, at most 1000)")
	all := fs.Bool("all", false, "follow the pages to the end")
	stale := fs.Bool("stale", false, "answer from the contacted node, not through the leader")
	if err := a.parseNone(fs, args, clientEnv(), " (use --key or --prefix)"); err != nil {
		return err
	}
	c, err := cf.staleClient(*stale)
	if err != nil {
		return err
	}
	out := &wire.LeaseList{Leases: []*wire.Lease{}}
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			return err
		}
		out.Leases = append(out.Leases, page.Leases...)
		out.Next = page.Next
		if !*all || page.Next == "" {
			break
		}
		req.After = page.Next
	}
	return output(a.stdout, cf.json, out, printLeaseList)
}

func printLeaseList(w io.Writer, l *wire.LeaseList) error {
	return table(w, "LEASE_ID\tKEY\tHOLDER\tSTATE\tFENCING\tREMAINING\tSESSION", l.Leases, func(tw io.Writer, x *wire.Lease) {
		rem := "-"
		if x.State == "active" {
			rem = msString(x.RemainingMS)
		}
		sess := cmp.Or(x.SessionID, "-")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", x.LeaseID, x.Key, x.Holder, x.State, x.FencingToken, rem, sess)
	}, l.Next)
}

func (a *app) validateCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("validate", "", "Check a fencing token (--key, --fencing-token) or a lease token (--lease-id, --lease-token).\nExit status 0 when valid, 1 when not.")
	cf := newClientFlags(fs)
	var req wire.ValidateRequest
	fs.StringVar(&req.Key, "key", "", "the key the fencing token is for")
	fs.Uint64Var(&req.FencingToken, "fencing-token", 0, "the fencing token to check")
	fs.StringVar(&req.LeaseID, "lease-id", "", "the lease the token is for")
	fs.StringVar(&req.Token, "lease-token", "", "the lease token to check (env LEASEHOLD_LEASE_TOKEN)")
	if err := a.parseNone(fs, args, clientEnv("lease-token"), ""); err != nil {
		return err
	}
	switch {
	case req.Key != "" && req.FencingToken != 0 && req.LeaseID == "":
		req.Token = "" // from the environment, maybe; not part of this question
	case req.LeaseID != "" && req.Token != "" && req.Key == "":
	default:
		return usageErrorf("validate needs --key with --fencing-token, or --lease-id with --lease-token")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	res, err := c.Validate(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		err = writeJSON(a.stdout, res)
	} else if res.Valid {
		_, err = fmt.Fprintln(a.stdout, "valid")
	} else {
		_, err = fmt.Fprintf(a.stdout, "invalid: %s\n", res.Reason)
	}
	if err != nil {
		return err
	}
	if !res.Valid {
		return &exitError{code: 1}
	}
	return nil
}

func (a *app) holderReleaseCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("holder-release", "HOLDER", "End every lease and session of HOLDER (admin scope, or a write token scoped to HOLDER): crash recovery of a restarted worker.")
	cf := newClientFlags(fs)
	reason := fs.String("reason", "", "why (kept as each lease's end_reason)")
	holder, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	res, err := c.ReleaseHolder(ctx, holder, *reason)
	if err != nil {
		return err
	}
	if cf.json {
		return writeJSON(a.stdout, res)
	}
	_, err = fmt.Fprintf(a.stdout, "released %d leases and sessions of %s\n", res.Released, res.Holder)
	return err
}

// parseOne parses a client command that takes exactly one argument. extraEnv
// names flags besides --addr and --token that read the environment.
func (a *app) parseOne(fs *flag.FlagSet, args []string, extraEnv ...string) (string, error) {
	pos, err := a.parse(fs, args, clientEnv(extraEnv...), 0)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", usageErrorf("%s takes exactly one argument (run 'leasehold %s -h')", fs.Name(), fs.Name())
	}
	return pos[0], nil
}

// parseNone parses a command that takes no arguments; hint ends the usage
// error of one given.
func (a *app) parseNone(fs *flag.FlagSet, args []string, env []envVar, hint string) error {
	pos, err := a.parse(fs, args, env, 0)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("%s takes no arguments%s", fs.Name(), hint)
	}
	return nil
}
