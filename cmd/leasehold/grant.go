package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// Grants from the command line: 'leasehold grant' reads a lease's grant as
// its holder, 'leasehold keys' prints the cluster's key set, 'leasehold
// verify' checks a grant against it (from a server, or from a file saved
// with 'leasehold keys --json'), and 'leasehold keygen --grant' makes a
// signing key for --grant-key-file.

// loadGrantKeyFile reads --grant-key-file. Errors never include the key.
func loadGrantKeyFile(path string, log *slog.Logger) (ed25519.PrivateKey, error) {
	k, err := grant.LoadKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("--grant-key-file: %w", err)
	}
	warnIfReadable(log, "--grant-key-file", path)
	return k, nil
}

// grantCmd prints a lease's grant, asked for as its holder.
func (a *app) grantCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("grant", "LEASE_ID", "Print a grant of an active lease, signed by the server that answers: a compact JWS\n"+
		"that a resource verifies offline against the cluster's keys ('leasehold verify').\n"+
		"Needs the lease's token, or the session's for a lease bound to a session. --json prints\n"+
		"the lease with its grant.")
	cf := newClientFlags(fs)
	token := fs.String("lease-token", "", "the lease's token (env LEASEHOLD_LEASE_TOKEN)")
	sessionToken := fs.String("session-token", "", "the session's token, for a bound lease (env LEASEHOLD_SESSION_TOKEN)")
	stale := fs.Bool("stale", false, "answer (and sign) at the contacted node, not through the leader")
	id, err := a.parseOne(fs, args, "lease-token", "session-token")
	if err != nil {
		return err
	}
	if *token == "" && *sessionToken == "" {
		return usageErrorf("grant needs --lease-token or --session-token")
	}
	c, err := cf.staleClient(*stale)
	if err != nil {
		return err
	}
	l, err := c.LeaseGrant(ctx, wire.GrantRequest{LeaseID: id, Token: *token, SessionToken: *sessionToken})
	if err != nil {
		return err
	}
	if cf.json {
		return writeJSON(a.stdout, l)
	}
	_, err = fmt.Fprintln(a.stdout, l.Grant)
	return err
}

// keysCmd prints the cluster's key set.
func (a *app) keysCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("keys", "", "Print the cluster's grant verification keys (GET /v1/keys): each key's id, server and\n"+
		"whether it is retired. --json prints the key set itself (a JWK Set), to save for\n"+
		"'leasehold verify --keys FILE' or for a resource's own verifier.")
	cf := newClientFlags(fs)
	stale := fs.Bool("stale", false, "answer from the contacted node, not through the leader")
	if err := a.parseNone(fs, args, clientEnv(), ""); err != nil {
		return err
	}
	c, err := cf.staleClient(*stale)
	if err != nil {
		return err
	}
	ks, err := c.Keys(ctx)
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, ks, printKeySet)
}

func printKeySet(w io.Writer, ks *grant.KeySet) error {
	if _, err := fmt.Fprintf(w, "cluster_id  %s\n", ks.ClusterID); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "KID\tSERVER\tSTATUS")
	for _, k := range ks.Keys {
		status := "current"
		if k.RetiredAt != nil {
			status = "retired at " + timeString(k.RetiredAt) + " (estimate)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", k.Kid, k.ServerID, status)
	}
	return tw.Flush()
}

// verifyCmd checks a grant.
func (a *app) verifyCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("verify", "GRANT", "Verify a grant (or '-': read it from stdin) and print its claims. The keys come from\n"+
		"the cluster (GET /v1/keys at --addr; no token needed) or from --keys FILE (a key set\n"+
		"saved with 'leasehold keys --json'), and so does the cluster id a grant must name\n"+
		"unless --cluster-id is given. The time claims are estimates: see --leeway and\n"+
		"--ignore-expiry. Exit status 0 when the grant verifies, 1 when not.")
	cf := newClientFlags(fs)
	keysFile := fs.String("keys", "", "key set file (JSON); default: fetch it from --addr")
	var opts grant.VerifyOptions
	fs.StringVar(&opts.ClusterID, "cluster-id", "", "the cluster the grant must name (default: the key set's)")
	fs.DurationVar(&opts.Leeway, "leeway", 0, "accept a grant this long past its expiry estimate (clock skew)")
	fs.BoolVar(&opts.IgnoreExpiry, "ignore-expiry", false, "accept a grant past its expiry estimate")
	pos, err := a.parse(fs, args, clientEnv(), 0)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("verify takes one GRANT (or - to read it from stdin)")
	}
	g := pos[0]
	if g == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, grant.MaxTokenBytes+1))
		if err != nil {
			return fmt.Errorf("read the grant from stdin: %w", err)
		}
		g = strings.TrimSpace(string(b))
	}
	if opts.Leeway < 0 {
		return usageErrorf("--leeway must not be negative")
	}
	var ks *grant.KeySet
	if *keysFile != "" {
		b, err := os.ReadFile(*keysFile)
		if err != nil {
			return usageErrorf("--keys: %v", err)
		}
		if ks, err = grant.ParseKeySet(b); err != nil {
			return usageErrorf("--keys %s: %v", *keysFile, err)
		}
	} else {
		c, err := cf.client()
		if err != nil {
			return err
		}
		if ks, err = c.Keys(ctx); err != nil {
			return err
		}
	}
	claims, verr := ks.Verify(g, opts)
	if cf.json {
		out := struct {
			Valid  bool          `json:"valid"`
			Reason string        `json:"reason,omitempty"`
			Claims *grant.Claims `json:"claims,omitempty"`
		}{Valid: verr == nil, Claims: claims}
		if verr != nil {
			out.Reason = verr.Error()
		}
		err = writeJSON(a.stdout, out)
	} else if verr == nil {
		err = printClaims(a.stdout, claims)
	} else {
		_, err = fmt.Fprintf(a.stdout, "invalid: %v\n", verr)
	}
	if err != nil {
		return err
	}
	if verr != nil {
		return &exitError{code: exitFailure}
	}
	return nil
}

func printClaims(w io.Writer, c *grant.Claims) error {
	if _, err := fmt.Fprintln(w, "valid"); err != nil {
		return err
	}
	p := newKV(w)
	p.add("cluster_id", c.ClusterID)
	p.add("server_id", c.ServerID)
	p.add("key", c.Key)
	p.add("lease_id", c.LeaseID)
	p.add("holder", c.Holder)
	p.add("fencing_token", c.FencingToken)
	p.add("limit", c.Limit)
	p.add("session_id", c.SessionID)
	p.add("ttl", msString(c.TTLMS))
	iat, exp := c.IssuedTime(), c.ExpiryTime()
	p.add("issued_at", timeString(&iat)+" (estimate)")
	p.add("expires_at", timeString(&exp)+" (estimate)")
	return p.flush()
}

// printGrantKey prints a new grant signing key (keygen --grant).
func printGrantKey(w io.Writer) error {
	_, err := w.Write(grant.MarshalPrivateKey(grant.GenerateKey()))
	return err
}

// waitGrantKeys waits until the key set lists a key of every server of the
// cluster (bench --grant on a cluster it just started: a grant asked for
// before the answering server's key is recorded is refused).
func waitGrantKeys(ctx context.Context, c *client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		st, err := c.Cluster(ctx)
		if err == nil {
			if ks, err := c.Keys(ctx); err == nil && len(ks.Keys) >= len(st.Members) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench --grant: the cluster's grant keys are not all recorded: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
