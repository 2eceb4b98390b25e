package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// keyLimitFlag collects repeated --key-limit KEY=N: the limit of one key
// of a multi-key acquire. The key is everything before the last '=' (keys
// may hold '=' and ':').
type keyLimitFlag map[string]uint32

func (m keyLimitFlag) String() string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+strconv.FormatUint(uint64(v), 10))
	}
	return strings.Join(parts, ",")
}

func (m keyLimitFlag) Set(s string) error {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 {
		return fmt.Errorf("want KEY=N, got %q", s)
	}
	n, err := strconv.ParseUint(s[i+1:], 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("want KEY=N with N a positive number, got %q", s)
	}
	m[s[:i]] = uint32(n)
	return nil
}

// isGroupID reports whether id names a lease group rather than a lease.
func isGroupID(id string) bool { return strings.HasPrefix(id, node.GroupIDPrefix) }

// acquireGroup is acquire with several keys: one lease on each, all or
// nothing, in one request (POST /v1/groups). req is the single-key
// request the flags made; limits are the --key-limit values.
func (a *app) acquireGroup(ctx context.Context, c *client.Client, asJSON bool, keys []string, req wire.AcquireRequest, limits keyLimitFlag) error {
	g := wire.GroupAcquireRequest{Holder: req.Holder, TTLMS: req.TTLMS, SessionID: req.SessionID, SessionToken: req.SessionToken,
		Metadata: req.Metadata, IdempotencyKey: req.IdempotencyKey, WaitMS: req.WaitMS, LockDelayMS: req.LockDelayMS}
	listed := map[string]bool{}
	for _, k := range keys {
		limit := req.Limit
		if n, ok := limits[k]; ok {
			limit = n
		}
		g.Keys = append(g.Keys, wire.GroupKey{Key: k, Limit: limit})
		listed[k] = true
	}
	for k := range limits {
		if !listed[k] {
			return usageErrorf("--key-limit %s: %q is not one of the KEYs", k, k)
		}
	}
	res, err := c.AcquireGroup(ctx, g)
	if err != nil {
		return err
	}
	return output(a.stdout, asJSON, res, printGroup)
}

func printGroup(w io.Writer, g *wire.LeaseGroup) error {
	p := newKV(w)
	p.add("group_id", g.GroupID)
	p.add("holder", g.Holder)
	p.add("state", g.State)
	p.add("session_id", g.SessionID)
	p.life(g.State, g.TTLMS, g.RemainingMS, g.ExpiresAt, g.HeartbeatIntervalMS)
	p.add("token", g.Token)
	if err := p.flush(); err != nil {
		return err
	}
	return table(w, "\nKEY\tLEASE_ID\tFENCING_TOKEN\tLIMIT\tSTATE", g.Leases, func(tw io.Writer, l *wire.Lease) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", l.Key, l.LeaseID, l.FencingToken, l.Limit, l.State)
	}, "")
}

// leaseOrGroup is what get prints: a lease, or a lease group for an lg_ id.
type leaseOrGroup struct {
	lease *wire.Lease
	group *wire.LeaseGroup
}

func (v leaseOrGroup) MarshalJSON() ([]byte, error) {
	if v.group != nil {
		return json.Marshal(v.group)
	}
	return json.Marshal(v.lease)
}

func getLeaseOrGroup(c *client.Client, ctx context.Context, id string) (leaseOrGroup, error) {
	if isGroupID(id) {
		g, err := c.GetGroup(ctx, id)
		return leaseOrGroup{group: g}, err
	}
	l, err := c.Get(ctx, id)
	return leaseOrGroup{lease: l}, err
}

func printLeaseOrGroup(w io.Writer, v leaseOrGroup) error {
	if v.group != nil {
		return printGroup(w, v.group)
	}
	return printLease(w, v.lease)
}
