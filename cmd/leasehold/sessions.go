package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

func (a *app) sessionCmd(ctx context.Context, args []string) error {
	subs := map[string]func(context.Context, []string) error{
		"create":    a.sessionCreate,
		"get":       a.sessionGet,
		"list":      a.sessionList,
		"heartbeat": a.sessionHeartbeat,
		"end":       a.sessionEnd,
	}
	if len(args) == 0 || subs[args[0]] == nil {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(a.stdout, "usage: leasehold session create|get|list|heartbeat|end [flags] [args]")
			return nil
		}
		return usageErrorf("usage: leasehold session create|get|list|heartbeat|end [flags] [args]")
	}
	return subs[args[0]](ctx, args[1:])
}

func (a *app) sessionCreate(ctx context.Context, args []string) error {
	fs := a.newFlagSet("session create", "", "Create a session and print it with its secret token (shown only here).")
	cf := newClientFlags(fs)
	holder := fs.String("holder", defaultHolder(), "holder name")
	ttl := fs.Duration("ttl", 30*time.Second, "session TTL")
	md := metadataFlag{}
	fs.Var(md, "metadata", "metadata key=value (repeatable)")
	if err := a.parseNone(fs, args, clientEnv(), ""); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	req := wire.SessionRequest{Holder: *holder, TTLMS: millis(*ttl)}
	if len(md) > 0 {
		req.Metadata = md
	}
	s, err := c.CreateSession(ctx, req)
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, s, printSession)
}

func (a *app) sessionGet(ctx context.Context, args []string) error {
	return showOne(a, ctx, args, "session get", "SESSION_ID", "Show one session.",
		(*client.Client).GetSession, printSession)
}

func (a *app) sessionList(ctx context.Context, args []string) error {
	fs := a.newFlagSet("session list", "", "List sessions; --all follows the pages to the end.")
	cf := newClientFlags(fs)
	holder := fs.String("holder", "", "only this holder")
	after := fs.String("after", "", "start after this cursor")
	all := fs.Bool("all", false, "follow the pages to the end")
	stale := fs.Bool("stale", false, "answer from the contacted node, not through the leader")
	if err := a.parseNone(fs, args, clientEnv(), ""); err != nil {
		return err
	}
	c, err := cf.staleClient(*stale)
	if err != nil {
		return err
	}
	out := &wire.SessionList{Sessions: []*wire.Session{}}
	cursor := *after
	for {
		page, err := c.ListSessions(ctx, *holder, cursor)
		if err != nil {
			return err
		}
		out.Sessions = append(out.Sessions, page.Sessions...)
		out.Next = page.Next
		if !*all || page.Next == "" {
			break
		}
		cursor = page.Next
	}
	return output(a.stdout, cf.json, out, printSessionList)
}

func printSessionList(w io.Writer, l *wire.SessionList) error {
	return table(w, "SESSION_ID\tHOLDER\tSTATE\tREMAINING\tLEASES", l.Sessions, func(tw io.Writer, s *wire.Session) {
		rem := "-"
		if s.State == "active" {
			rem = msString(s.RemainingMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", s.SessionID, s.Holder, s.State, rem, len(s.LeaseIDs))
	}, l.Next)
}

func (a *app) sessionHeartbeat(ctx context.Context, args []string) error {
	fs := a.newFlagSet("session heartbeat", "SESSION_ID", "Renew a session and every lease bound to it.")
	cf := newClientFlags(fs)
	token := fs.String("session-token", "", "the session's token (env LEASEHOLD_SESSION_TOKEN)")
	id, err := a.parseOne(fs, args, "session-token")
	if err != nil {
		return err
	}
	if *token == "" {
		return usageErrorf("session heartbeat needs --session-token or LEASEHOLD_SESSION_TOKEN")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	s, err := c.SessionHeartbeat(ctx, id, *token)
	if err != nil {
		return err
	}
	return output(a.stdout, cf.json, s, printSession)
}

func (a *app) sessionEnd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("session end", "SESSION_ID", "End a session; its leases end with reason session_ended.\nWithout --session-token an operator forces the end (admin scope).")
	cf := newClientFlags(fs)
	token := fs.String("session-token", "", "the session's token (env LEASEHOLD_SESSION_TOKEN); none: forced end")
	id, err := a.parseOne(fs, args, "session-token")
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	s, err := c.EndSession(ctx, id, *token)
	if err != nil {
		return err
	}
	return printOr(a.stdout, cf.json, s, "ended "+id, printSession)
}
