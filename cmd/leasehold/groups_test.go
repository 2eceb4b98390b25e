package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestAcquireSeveralKeys: against a real node, `leasehold acquire` with
// several keys takes them in one request, all or nothing (each its own
// limit with --key-limit, its own fencing token); a busy key fails the
// whole with LEASE_HELD naming it and its holder (exit code busy) and
// takes nothing; get, renew and release take the group's lg_ id.
func TestAcquireSeveralKeys(t *testing.T) {
	c, addr := startTestNode(t)
	env := map[string]string{"LEASEHOLD_ADDR": addr}
	ctx := context.Background()
	run := func(args ...string) (string, string, error) {
		a, out, errb := testApp(env)
		err := a.run(ctx, args)
		return out.String(), errb.String(), err
	}
	out, _, err := run("acquire", "tuners", "dedup/s1", "--key-limit", "tuners=3", "--holder", "worker", "--ttl", "30s", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var g wire.LeaseGroup
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if g.Token == "" || len(g.Leases) != 2 || g.Leases[0].Key != "dedup/s1" || g.Leases[1].Key != "tuners" || g.Leases[1].Limit != 3 || g.Leases[0].Limit != 1 {
		t.Fatalf("group %+v", g)
	}

	// dedup/s1 is held: the second group takes nothing, and says why.
	a, _, errb := testApp(env)
	code := report(a.run(ctx, []string{"acquire", "dedup/s1", "other/1", "--holder", "w2", "--ttl", "30s"}), errb)
	if code != exitBusy || !strings.Contains(errb.String(), "LEASE_HELD") || !strings.Contains(errb.String(), `"dedup/s1"`) ||
		!strings.Contains(errb.String(), "held by worker (lease "+g.Leases[0].LeaseID) {
		t.Fatalf("exit %d, stderr %q", code, errb)
	}
	if l, err := c.List(ctx, wire.ListRequest{Key: "other/1"}); err != nil || len(l.Leases) != 0 {
		t.Fatalf("the refused group took other/1: %+v %v", l, err)
	}

	out, _, err = run("get", g.GroupID)
	if err != nil || !strings.Contains(out, g.GroupID) || !strings.Contains(out, "FENCING_TOKEN") || !strings.Contains(out, g.Leases[1].LeaseID) || strings.Contains(out, g.Token) {
		t.Fatalf("get: %v\n%s", err, out)
	}
	out, _, err = run("get", g.Leases[0].LeaseID)
	if err != nil || !strings.Contains(out, "group_id") || !strings.Contains(out, g.GroupID) {
		t.Fatalf("get a member: %v\n%s", err, out)
	}
	out, _, err = run("renew", g.GroupID, "--lease-token", g.Token, "--ttl", "20s", "--json")
	var rg wire.LeaseGroup
	if err != nil || json.Unmarshal([]byte(out), &rg) != nil || rg.TTLMS != 20000 || rg.Leases[0].RenewalCount != 1 {
		t.Fatalf("renew: %v\n%s", err, out)
	}
	if _, _, err := run("release", g.GroupID, "--lease-token", g.Token, "--reason", "done"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetGroup(ctx, g.GroupID); err != nil || got.State != "released" || got.Leases[1].EndReason != "done" {
		t.Fatalf("after release: %+v %v", got, err)
	}

	for _, args := range [][]string{
		{"acquire", "a", "b", "--key-limit", "c=2"},
		{"acquire", "a", "b", "--key-limit", "b=0"},
		{"acquire", "a", "b", "--key-limit", "b"},
	} {
		a, _, errb := testApp(env)
		if code := report(a.run(ctx, append(args, "--holder", "w", "--ttl", "5s")), errb); code != exitUsage {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb)
		}
	}
	if l, err := c.List(ctx, wire.ListRequest{Key: "a"}); err != nil || len(l.Leases) != 0 {
		t.Fatalf("a usage error took a lease: %+v %v", l, err)
	}
}
