package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

func (a *app) clusterCmd(ctx context.Context, args []string) error {
	const usage = "usage: leasehold cluster status|members|remove ID|transfer-leadership [ID] [flags]"
	if len(args) == 0 {
		return usageErrorf("%s", usage)
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprintln(a.stdout, usage)
		return nil
	case "status", "members":
		return a.clusterShow(ctx, sub, args)
	case "remove":
		return a.clusterRemove(ctx, args)
	case "transfer-leadership":
		return a.clusterTransferLeadership(ctx, args)
	}
	return usageErrorf("unknown cluster command %q; %s", sub, usage)
}

// clusterShow is "cluster status" and "cluster members" (sub).
func (a *app) clusterShow(ctx context.Context, sub string, args []string) error {
	fs := a.newFlagSet("cluster "+sub, "", "Show the cluster as the contacted node sees it.")
	cf := newClientFlags(fs)
	if err := a.parseNone(fs, args, clientEnv(), ""); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	st, err := c.Cluster(ctx)
	if client.ErrorCode(err) == wire.CodeNoLeader {
		// No leader to ask: show the contacted node's own view.
		sc, serr := cf.staleClient(true)
		if serr != nil {
			return serr
		}
		if st, err = sc.Cluster(ctx); err == nil {
			fmt.Fprintf(a.stderr, "warning: no leader; this is %s's own view\n", st.NodeID)
		}
	}
	if err != nil {
		return err
	}
	switch {
	case cf.json && sub == "members":
		return writeJSON(a.stdout, st.Members)
	case cf.json:
		return writeJSON(a.stdout, st)
	case sub == "members":
		return printMembers(a.stdout, st.Members)
	}
	return printCluster(a.stdout, st)
}

// clusterRemove is "cluster remove ID".
func (a *app) clusterRemove(ctx context.Context, args []string) error {
	fs := a.newFlagSet("cluster remove", "ID", "Remove a server from the cluster (admin scope).")
	cf := newClientFlags(fs)
	id, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if err := c.RemoveMember(ctx, id); err != nil {
		return err
	}
	return a.done(cf.json, map[string]any{"id": id, "removed": true}, "removed "+id)
}

// clusterTransferLeadership is "cluster transfer-leadership [ID]".
func (a *app) clusterTransferLeadership(ctx context.Context, args []string) error {
	fs := a.newFlagSet("cluster transfer-leadership", "[ID]", "Hand leadership to the voter ID, or to any voter (admin scope).")
	cf := newClientFlags(fs)
	pos, err := a.parse(fs, args, clientEnv(), 0)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErrorf("cluster transfer-leadership takes at most one ID")
	}
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if err := c.TransferLeadership(ctx, id); err != nil {
		return err
	}
	msg := "leadership transfer started"
	if id != "" {
		msg += " towards " + id
	}
	return a.done(cf.json, map[string]any{"id": id, "transferred": true}, msg)
}

// done prints the outcome of an action that has no object to show.
func (a *app) done(asJSON bool, v any, msg string) error {
	if asJSON {
		return writeJSON(a.stdout, v)
	}
	_, err := fmt.Fprintln(a.stdout, msg)
	return err
}

func printCluster(w io.Writer, st *wire.ClusterStatus) error {
	p := newKV(w)
	p.add("node", st.NodeID)
	p.add("state", st.State)
	leader := cmp.Or(st.Leader, "(none known)")
	if st.LeaderAddr != "" {
		leader += " at " + st.LeaderAddr
	}
	p.add("leader", leader)
	p.add("term", st.Term)
	p.add("commit_index", st.CommitIndex)
	p.add("applied_index", st.AppliedIndex)
	p.add("tick", st.Tick)
	p.add("tick_period", msString(st.TickPeriodMS))
	p.add("active_leases", st.ActiveLeases)
	p.add("active_sessions", st.ActiveSession)
	if err := p.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printMembers(w, st.Members)
}

func printMembers(w io.Writer, ms []wire.Member) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRAFT\tHTTP\tROLE\tHEALTH\tGOSSIP\tLAST_CONTACT")
	for _, m := range ms {
		role := "nonvoter"
		switch {
		case m.Leader:
			role = "leader"
		case m.Voter:
			role = "voter"
		}
		httpAddr := cmp.Or(m.HTTPAddr, "-")
		last := cmp.Or(timeString(m.LastContact), "-")
		gossip := cmp.Or(m.Gossip, "-")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.RaftAddr, httpAddr, role, m.Health, gossip, last)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Reason != "" {
			fmt.Fprintf(w, "%s is %s: %s\n", m.ID, m.Health, m.Reason)
		}
	}
	return nil
}
