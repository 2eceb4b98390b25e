package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/wire"
)

// waitingCount is how many acquires (a group counts one per key) the state
// machine has queued.
func (n *Node) waitingCount() int {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Waiting()
}

func keysOf(keys ...string) []wire.GroupKey {
	out := make([]wire.GroupKey, len(keys))
	for i, k := range keys {
		out[i].Key = k
	}
	return out
}

// TestAcquireGroup: a group is granted whole, one lease per key (in key
// order) each with its own fencing token, above every earlier token of its
// key; a busy key refuses it with LEASE_HELD naming that key and its
// holder, and nothing is granted; members are renewed and released only
// through the group; bad input is refused and changes nothing.
func TestAcquireGroup(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	x, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuners", Holder: "x", TTLMS: 5000, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	y, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuners", Holder: "y", TTLMS: 5000, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	req := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "tuners", Limit: 2}, {Key: "dedup/s1"}}, Holder: "w1", TTLMS: 5000}
	_, _, err = n.AcquireGroup(ctx, req)
	e, ok := err.(*wire.Error)
	if !ok || e.Code != wire.CodeLeaseHeld || e.Key != "tuners" || len(e.Holders) != 2 || e.Holders[0].Holder != "x" || e.Holders[1].LeaseID != y.LeaseID {
		t.Fatalf("group with a full key: %v %+v", err, e)
	}
	if l, _ := n.ListLeases(ctx, wire.ListRequest{Key: "dedup/s1"}, false); len(l.Leases) != 0 {
		t.Fatalf("a refused group left %+v", l.Leases)
	}

	bad := []struct {
		name  string
		req   wire.GroupAcquireRequest
		field string
	}{
		{"no keys", wire.GroupAcquireRequest{Holder: "w", TTLMS: 5000}, "keys"},
		{"a key twice", wire.GroupAcquireRequest{Keys: keysOf("a", "b", "a"), Holder: "w", TTLMS: 5000}, "keys"},
		{"too many keys", wire.GroupAcquireRequest{Keys: keysOf(strings.Split(strings.Repeat("k,", 65), ",")[:65]...), Holder: "w", TTLMS: 5000}, "keys"},
		{"reserved key", wire.GroupAcquireRequest{Keys: keysOf("a", ReservedKeyPrefix+"x"), Holder: "w", TTLMS: 5000}, "key"},
		{"empty key", wire.GroupAcquireRequest{Keys: keysOf("a", ""), Holder: "w", TTLMS: 5000}, "key"},
		{"limit too large", wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "a", Limit: 10001}}, Holder: "w", TTLMS: 5000}, "limit"},
		{"no ttl", wire.GroupAcquireRequest{Keys: keysOf("a"), Holder: "w"}, "ttl_ms"},
		{"no holder", wire.GroupAcquireRequest{Keys: keysOf("a"), TTLMS: 5000}, "holder"},
		{"wait too long", wire.GroupAcquireRequest{Keys: keysOf("a"), Holder: "w", TTLMS: 5000, WaitMS: -1}, "wait_ms"},
	}
	for _, b := range bad {
		_, _, err := n.AcquireGroup(ctx, b.req)
		if e, ok := err.(*wire.Error); !ok || e.Code != wire.CodeInvalidArgument || e.Field != b.field {
			t.Errorf("%s: %v (field %q, want %q)", b.name, err, e.Field, b.field)
		}
	}
	if l, _ := n.ListLeases(ctx, wire.ListRequest{Holder: "w"}, false); len(l.Leases) != 0 {
		t.Fatalf("bad groups left %+v", l.Leases)
	}

	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: y.LeaseID, Token: y.Token}); err != nil {
		t.Fatal(err)
	}
	g, replayed, err := n.AcquireGroup(ctx, req)
	if err != nil || replayed {
		t.Fatal(err, replayed)
	}
	if !strings.HasPrefix(g.GroupID, GroupIDPrefix) || g.Token == "" || g.State != "active" || g.Holder != "w1" || len(g.Leases) != 2 || g.RemainingMS <= 0 {
		t.Fatalf("group %+v", g)
	}
	if g.Leases[0].Key != "dedup/s1" || g.Leases[1].Key != "tuners" || g.Leases[1].Limit != 2 {
		t.Fatalf("members not in key order: %+v", g.Leases)
	}
	for i, l := range g.Leases {
		if l.GroupID != g.GroupID || l.State != "active" || l.Token != "" || l.Holder != "w1" {
			t.Fatalf("member %d: %+v", i, l)
		}
	}
	if g.Leases[1].FencingToken <= y.FencingToken || g.Leases[1].FencingToken <= g.Leases[0].FencingToken {
		t.Fatalf("fences: tuners %d after %d, dedup %d", g.Leases[1].FencingToken, y.FencingToken, g.Leases[0].FencingToken)
	}
	// Each member is an ordinary lease to readers and validators, with the
	// group's token.
	got, err := n.GetLease(ctx, g.Leases[0].LeaseID, false)
	if err != nil || got.GroupID != g.GroupID {
		t.Fatalf("member read: %+v %v", got, err)
	}
	if v, err := n.Validate(ctx, wire.ValidateRequest{LeaseID: g.Leases[1].LeaseID, Token: g.Token}); err != nil || !v.Valid {
		t.Fatalf("validate a member with the group token: %+v %v", v, err)
	}
	if v, err := n.Validate(ctx, wire.ValidateRequest{Key: "tuners", FencingToken: g.Leases[1].FencingToken}); err != nil || !v.Valid {
		t.Fatalf("validate a member's fence: %+v %v", v, err)
	}
	if _, err := n.Renew(ctx, g.Leases[0].LeaseID, g.Token, 0); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("renew a member alone: %v", err)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: g.Leases[0].LeaseID, Token: g.Token}); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("release a member alone: %v", err)
	}
	if _, err := n.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: g.GroupID, Token: x.Token}); wire.ErrorCode(err) != wire.CodeLeaseTokenInvalid {
		t.Fatalf("renew with another token: %v", err)
	}
	if _, err := n.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: "lg_nope", Token: g.Token}); wire.ErrorCode(err) != wire.CodeLeaseNotFound {
		t.Fatalf("renew an unknown group: %v", err)
	}
	// A member's grant is its holder's, through the group's token.
	waitGrantKey(t, n)
	if gl, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: g.Leases[1].LeaseID, Token: g.Token}, false); err != nil || gl.Grant == "" || gl.GroupID != g.GroupID {
		t.Fatalf("a member's grant: %+v %v", gl, err)
	}
	rg, err := n.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: g.GroupID, Token: g.Token, TTLMS: 8000})
	if err != nil || rg.TTLMS != 8000 || rg.Leases[0].RenewalCount != 1 || rg.Leases[1].RenewalCount != 1 {
		t.Fatalf("renew: %+v %v", rg, err)
	}
	gg, err := n.GetGroup(ctx, g.GroupID, false)
	if err != nil || gg.Token != "" || gg.Leases[1].FencingToken != g.Leases[1].FencingToken || gg.TTLMS != 8000 {
		t.Fatalf("get: %+v %v", gg, err)
	}
	rel, err := n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token, Reason: "stream stopped"})
	if err != nil || rel.State != "released" {
		t.Fatalf("release: %+v %v", rel, err)
	}
	for _, l := range rel.Leases {
		if l.State != "released" || l.EndReason != "stream stopped" {
			t.Fatalf("released member %+v", l)
		}
	}
	if _, err := n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); wire.ErrorCode(err) != wire.CodeLeaseReleased {
		t.Fatalf("release twice: %v", err)
	}
	if _, err := n.GetGroup(ctx, "lg_nope", false); wire.ErrorCode(err) != wire.CodeLeaseNotFound {
		t.Fatalf("get unknown: %v", err)
	}
}

// TestAcquireGroupIdempotent: concurrent identical group acquires with one
// idempotency key yield one group and the same token; the same key with
// other keys conflicts.
func TestAcquireGroupIdempotent(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	req := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "tuners", Limit: 4}, {Key: "dedup/s1"}}, Holder: "w1", TTLMS: 5000, IdempotencyKey: "intent-1"}
	type res struct {
		g        *wire.LeaseGroup
		replayed bool
		err      error
	}
	out := make([]res, 6)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			g, r, err := n.AcquireGroup(ctx, req)
			out[i] = res{g, r, err}
		})
	}
	wg.Wait()
	created := 0
	for i, r := range out {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if !r.replayed {
			created++
		}
		if r.g.GroupID != out[0].g.GroupID || r.g.Token != out[0].g.Token || r.g.Leases[1].LeaseID != out[0].g.Leases[1].LeaseID {
			t.Fatalf("request %d got %+v, request 0 %+v", i, r.g, out[0].g)
		}
	}
	if created != 1 {
		t.Fatalf("%d requests created a group", created)
	}
	req.Keys = keysOf("dedup/s2")
	if _, _, err := n.AcquireGroup(ctx, req); wire.ErrorCode(err) != wire.CodeIdempotencyConflict {
		t.Fatalf("other keys under the same idempotency key: %v", err)
	}
}

// TestAcquireGroupOlderServer: while a server of the configuration runs a
// version that does not read lease groups, every group operation is
// refused with UNAVAILABLE and changes nothing.
func TestAcquireGroupOlderServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.olderPeer = true
	n := openNode(t, cfg)
	ctx := context.Background()
	if _, _, err := n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("a", "b"), Holder: "w", TTLMS: 5000}); wire.ErrorCode(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "older version") {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := n.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: "lg_1", Token: "t"}); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("renew: %v", err)
	}
	if _, err := n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: "lg_1", Token: "t"}); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("release: %v", err)
	}
	if l, _ := n.ListLeases(ctx, wire.ListRequest{}, false); len(l.Leases) != 0 {
		t.Fatalf("leases: %+v", l.Leases)
	}
}

// TestGroupContention: workers race group acquires over overlapping keys
// (and single acquires), releasing what they get. No key ever has two
// holders; every group's leases were granted in one log entry (their
// acquired events share an index) and released in one; a refusal names a
// key of the group that was busy.
func TestGroupContention(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	sub, err := n.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	keys := []string{"k0", "k1", "k2", "k3"}
	const workers, rounds = 6, 25
	var mu sync.Mutex
	granted := map[string][]*wire.Lease{}
	refused := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			holder := fmt.Sprint("w", w)
			for range rounds {
				if w%3 == 2 { // a single-key worker
					l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: keys[rng.IntN(len(keys))], Holder: holder, TTLMS: 5000})
					if err == nil {
						n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
					} else if wire.ErrorCode(err) != wire.CodeLeaseHeld {
						t.Error(err)
					}
					continue
				}
				ks := rng.Perm(len(keys))[:2+rng.IntN(2)]
				var req wire.GroupAcquireRequest
				for _, i := range ks {
					req.Keys = append(req.Keys, wire.GroupKey{Key: keys[i]})
				}
				req.Holder, req.TTLMS = holder, 5000
				g, _, err := n.AcquireGroup(ctx, req)
				if err != nil {
					e, ok := err.(*wire.Error)
					if !ok || e.Code != wire.CodeLeaseHeld || !strings.Contains(fmt.Sprint(req.Keys), e.Key) {
						t.Errorf("refusal %v does not name a key of %v", err, req.Keys)
					}
					mu.Lock()
					refused++
					mu.Unlock()
					continue
				}
				if len(g.Leases) != len(req.Keys) {
					t.Errorf("group of %d keys got %d leases", len(req.Keys), len(g.Leases))
				}
				mu.Lock()
				granted[g.GroupID] = g.Leases
				mu.Unlock()
				if _, err := n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if len(granted) < 10 || refused < 10 {
		t.Fatalf("%d groups granted, %d refused: too little contention to prove anything", len(granted), refused)
	}
	// Replay the history up to a last write.
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "end", Holder: "t", TTLMS: 5000}); err != nil {
		t.Fatal(err)
	}
	holders := map[string]string{} // key -> lease id
	acquiredAt, releasedAt := map[string]uint64{}, map[string]uint64{}
	fences := map[string]uint64{}
	for {
		var ev wire.Event
		select {
		case ev = <-sub.Events():
		case <-time.After(10 * time.Second):
			t.Fatal("event stream stalled")
		}
		if l := ev.Lease; l != nil {
			switch ev.Type {
			case "acquired":
				if h := holders[l.Key]; h != "" {
					t.Fatalf("event %s: %s acquired %s held by %s", ev.ID, l.LeaseID, l.Key, h)
				}
				if l.FencingToken <= fences[l.Key] {
					t.Fatalf("event %s: fence %d on %s after %d", ev.ID, l.FencingToken, l.Key, fences[l.Key])
				}
				holders[l.Key], fences[l.Key] = l.LeaseID, l.FencingToken
				if g := l.GroupID; g != "" {
					if at, ok := acquiredAt[g]; ok && at != ev.Index {
						t.Fatalf("group %s acquired at indexes %d and %d", g, at, ev.Index)
					}
					acquiredAt[g] = ev.Index
				}
			case "released", "expired", "revoked":
				if holders[l.Key] == l.LeaseID {
					delete(holders, l.Key)
				}
				if g := l.GroupID; g != "" {
					if at, ok := releasedAt[g]; ok && at != ev.Index {
						t.Fatalf("group %s ended at indexes %d and %d", g, at, ev.Index)
					}
					releasedAt[g] = ev.Index
				}
			}
		}
		if ev.Key == "end" {
			break
		}
	}
	if len(acquiredAt) != len(granted) {
		t.Fatalf("%d groups in the history, %d granted", len(acquiredAt), len(granted))
	}
}

// groupOutcome is what a waiting acquire (of a group or one key) got.
type groupOutcome struct {
	name   string
	group  *wire.LeaseGroup
	lease  *wire.Lease
	err    error
	fences map[string]uint64
	at     time.Time
}

// TestGroupWaitFairness: a group waiting for two held keys, with a single
// waiter behind it on each key, is granted once both are free, not before;
// the single waiter of the key that frees first is not served ahead of it
// (the group's place is kept); once the group releases, both singles are
// granted. Nothing deadlocks.
func TestGroupWaitFairness(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	xa, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "a", Holder: "x", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	yb, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "b", Holder: "y", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan groupOutcome, 3)
	go func() {
		g, _, err := n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("b", "a"), Holder: "g", TTLMS: 60000, WaitMS: 20000})
		out <- groupOutcome{name: "group", group: g, err: err, at: time.Now()}
	}()
	waitFor(t, 5*time.Second, func() bool { return n.waitingCount() == 2 })
	for i, k := range []string{"a", "b"} {
		go func() {
			l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: k, Holder: "s" + k, TTLMS: 60000, WaitMS: 20000})
			out <- groupOutcome{name: "single " + k, lease: l, err: err, at: time.Now()}
		}()
		waitFor(t, 5*time.Second, func() bool { return n.waitingCount() == 3+i })
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: xa.LeaseID, Token: xa.Token}); err != nil {
		t.Fatal(err)
	}
	// a is free, but the group heads its queue: nobody gets it.
	select {
	case o := <-out:
		t.Fatalf("%s answered while the group waits for b: %+v %v", o.name, o.lease, o.err)
	case <-time.After(300 * time.Millisecond): // 15 ticks
	}
	if l, _ := n.ListLeases(ctx, wire.ListRequest{Key: "a", State: "active"}, false); len(l.Leases) != 0 {
		t.Fatalf("a granted while the group waits: %+v", l.Leases[0])
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "a", Holder: "z", TTLMS: 60000}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire without wait of the held-up key: %v", err)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: yb.LeaseID, Token: yb.Token}); err != nil {
		t.Fatal(err)
	}
	o := <-out
	if o.name != "group" || o.err != nil || len(o.group.Leases) != 2 || o.group.Token == "" {
		t.Fatalf("first answer %s: %+v %v", o.name, o.group, o.err)
	}
	g := o.group
	select {
	case o := <-out:
		t.Fatalf("%s answered while the group holds its key: %+v %v", o.name, o.lease, o.err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		o := <-out
		if o.err != nil || o.lease == nil || o.lease.Holder != "s"+o.lease.Key {
			t.Fatalf("%s: %+v %v", o.name, o.lease, o.err)
		}
		for _, m := range g.Leases {
			if m.Key == o.lease.Key && o.lease.FencingToken <= m.FencingToken {
				t.Fatalf("%s fence %d not after the group's %d", o.name, o.lease.FencingToken, m.FencingToken)
			}
		}
	}
}

// TestGroupWaitNoDeadlock: groups over crossing keys (a+b, b+c, a+c) and
// single waiters, all queued while every key is held, are all granted in
// the end, each key serving its waiters in the order they arrived.
func TestGroupWaitNoDeadlock(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	var first []*wire.Lease
	for _, k := range []string{"a", "b", "c"} {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: k, Holder: "first", TTLMS: 60000})
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, l)
	}
	type waiter struct {
		name string
		keys []string
	}
	waiters := []waiter{{"G1", []string{"a", "b"}}, {"G2", []string{"b", "c"}}, {"Sc", []string{"c"}}, {"G3", []string{"a", "c"}}, {"Sa", []string{"a"}}, {"Sb", []string{"b"}}}
	out := make(chan groupOutcome, len(waiters))
	queued := 0
	for _, w := range waiters {
		go func() {
			o := groupOutcome{name: w.name, fences: map[string]uint64{}}
			release := func() {}
			if len(w.keys) > 1 {
				o.group, _, o.err = n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf(w.keys...), Holder: w.name, TTLMS: 60000, WaitMS: 30000})
				if o.err == nil {
					for _, l := range o.group.Leases {
						o.fences[l.Key] = l.FencingToken
					}
					release = func() {
						n.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: o.group.GroupID, Token: o.group.Token})
					}
				}
			} else {
				o.lease, _, o.err = n.Acquire(ctx, wire.AcquireRequest{Key: w.keys[0], Holder: w.name, TTLMS: 60000, WaitMS: 30000})
				if o.err == nil {
					o.fences[o.lease.Key] = o.lease.FencingToken
					release = func() { n.Release(ctx, wire.ReleaseRequest{LeaseID: o.lease.LeaseID, Token: o.lease.Token}) }
				}
			}
			time.Sleep(40 * time.Millisecond) // hold it a couple of ticks (part of the scenario: others keep waiting)
			release()
			out <- o
		}()
		queued += len(w.keys)
		waitFor(t, 5*time.Second, func() bool { return n.waitingCount() == queued })
	}
	for _, l := range []*wire.Lease{first[2], first[1], first[0]} { // c, b, then a
		if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]groupOutcome{}
	for range waiters {
		select {
		case o := <-out:
			if o.err != nil {
				t.Fatalf("%s: %v", o.name, o.err)
			}
			got[o.name] = o
		case <-time.After(40 * time.Second):
			t.Fatalf("deadlock: granted only %v", got)
		}
	}
	// Arrival order per key: a G1 G3 Sa, b G1 G2 Sb, c G2 Sc G3.
	for key, order := range map[string][]string{"a": {"G1", "G3", "Sa"}, "b": {"G1", "G2", "Sb"}, "c": {"G2", "Sc", "G3"}} {
		for i := 1; i < len(order); i++ {
			if got[order[i]].fences[key] <= got[order[i-1]].fences[key] {
				t.Errorf("key %s: %s (fence %d) served before %s (fence %d)", key, order[i], got[order[i]].fences[key], order[i-1], got[order[i-1]].fences[key])
			}
		}
	}
}

// TestGroupWaitTimesOut: a group whose keys do not all free within wait_ms
// is refused with LEASE_HELD naming the busy key and its holder, is
// withdrawn from every queue, and the single waiter behind it on the free
// key is served.
func TestGroupWaitTimesOut(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "b", Holder: "yves", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	out := make(chan groupOutcome, 2)
	go func() {
		g, _, err := n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("a", "b"), Holder: "g", TTLMS: 60000, WaitMS: 300})
		out <- groupOutcome{name: "group", group: g, err: err}
	}()
	waitFor(t, 5*time.Second, func() bool { return n.waitingCount() == 2 })
	go func() {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "a", Holder: "s", TTLMS: 60000, WaitMS: 20000})
		out <- groupOutcome{name: "single", lease: l, err: err}
	}()
	for range 2 {
		o := <-out
		switch o.name {
		case "group":
			e, ok := o.err.(*wire.Error)
			if !ok || e.Code != wire.CodeLeaseHeld || e.Key != "b" || len(e.Holders) != 1 || e.Holders[0].Holder != "yves" {
				t.Fatalf("group after its wait: %+v %v", o.group, o.err)
			}
		case "single":
			if o.err != nil || o.lease.Key != "a" {
				t.Fatalf("single behind the group: %+v %v", o.lease, o.err)
			}
		}
	}
	if w := n.waitingCount(); w != 0 {
		t.Fatalf("%d still queued", w)
	}
}

// TestGroupSnapshotRestart: a granted group and a queued one survive a
// restart from a snapshot: the granted group keeps its leases, fences and
// token; the queued one is still queued on both keys and is granted when
// they free.
func TestGroupSnapshotRestart(t *testing.T) {
	defer func(n uint64) { closeSnapshotMin = n }(closeSnapshotMin)
	closeSnapshotMin = 1
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SnapshotThreshold = 1 << 40
	cfg.SnapshotInterval = time.Hour
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-n.Ready()
	waitFor(t, 5*time.Second, n.lt.isReady)
	ctx := context.Background()
	g, _, err := n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "a"}, {Key: "b", Limit: 3}}, Holder: "w", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	y, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "d", Holder: "y", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := n.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("c", "d"), Holder: "q", TTLMS: 60000, WaitMS: 60000})
		done <- err
	}()
	waitFor(t, 5*time.Second, func() bool { return n.waitingCount() == 2 })
	applied := n.AppliedIndex()
	n.Close()
	<-done // the node went away under it
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := snaps.List(); err != nil || len(list) == 0 || list[0].Index < applied {
		t.Fatalf("no snapshot at %d: %+v %v", applied, list, err)
	}

	n2 := openNode(t, cfg)
	got, err := n2.GetGroup(ctx, g.GroupID, false)
	if err != nil || got.State != "active" || len(got.Leases) != 2 || got.Leases[1].Limit != 3 {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	for i, l := range got.Leases {
		if l.FencingToken != g.Leases[i].FencingToken || l.GroupID != g.GroupID {
			t.Fatalf("member %d after restart: %+v", i, l)
		}
	}
	if _, err := n2.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatalf("renew with the token after restart: %v", err)
	}
	if _, err := n2.Renew(ctx, g.Leases[0].LeaseID, g.Token, 0); wire.ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("a member renewed alone after restart: %v", err)
	}
	if w := n2.waitingCount(); w != 2 {
		t.Fatalf("queued after restart: %d, want the group on both keys", w)
	}
	if _, err := n2.Release(ctx, wire.ReleaseRequest{LeaseID: y.LeaseID, Token: y.Token}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return n2.waitingCount() == 0 })
	for _, k := range []string{"c", "d"} {
		l, err := n2.ListLeases(ctx, wire.ListRequest{Key: k, State: "active"}, false)
		if err != nil || len(l.Leases) != 1 || l.Leases[0].Holder != "q" || l.Leases[0].GroupID == "" {
			t.Fatalf("%s after the queued group's keys freed: %+v %v", k, l, err)
		}
	}
}

// TestClusterGroupFailover: a group granted by one leader is the same
// group under the next one (leases, fences, token, holders named in a
// refusal), on every replica; it renews and releases there, and new
// groups get higher fences.
func TestClusterGroupFailover(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	old := c.leader()
	req := wire.GroupAcquireRequest{Keys: []wire.GroupKey{{Key: "dedup/s1"}, {Key: "tuners", Limit: 2}}, Holder: "w1", TTLMS: 10000}
	var g *wire.LeaseGroup
	var err error
	waitFor(t, 10*time.Second, func() bool { // until gossip knows every server
		g, _, err = old.AcquireGroup(ctx, req)
		if err != nil && wire.ErrorCode(err) != wire.CodeUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	oldID := old.cfg.NodeID
	c.stop(oldID)
	nl := c.leader(oldID)
	got, err := nl.GetGroup(ctx, g.GroupID, false)
	if err != nil || got.State != "active" {
		t.Fatalf("after failover: %+v %v", got, err)
	}
	for i, l := range got.Leases {
		if l.LeaseID != g.Leases[i].LeaseID || l.FencingToken != g.Leases[i].FencingToken {
			t.Fatalf("member %d after failover: %+v, was %+v", i, l, g.Leases[i])
		}
	}
	var other *wire.LeaseGroup
	waitFor(t, 10*time.Second, func() bool {
		_, _, err = nl.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("dedup/s1", "x"), Holder: "w2", TTLMS: 10000})
		return wire.ErrorCode(err) != wire.CodeUnavailable
	})
	if e, ok := err.(*wire.Error); !ok || e.Code != wire.CodeLeaseHeld || e.Key != "dedup/s1" || len(e.Holders) != 1 || e.Holders[0].Holder != "w1" || e.Holders[0].LeaseID != g.Leases[0].LeaseID {
		t.Fatalf("second holder on a member's key after failover: %v", err)
	}
	if _, err := nl.RenewGroup(ctx, wire.GroupRenewRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatalf("renew after failover: %v", err)
	}
	if _, err := nl.ReleaseGroup(ctx, wire.GroupReleaseRequest{GroupID: g.GroupID, Token: g.Token}); err != nil {
		t.Fatalf("release after failover: %v", err)
	}
	other, _, err = nl.AcquireGroup(ctx, wire.GroupAcquireRequest{Keys: keysOf("dedup/s1", "x"), Holder: "w2", TTLMS: 10000})
	if err != nil || other.Leases[0].FencingToken <= g.Leases[1].FencingToken {
		t.Fatalf("acquire after failover: %+v %v", other, err)
	}
	target := nl.AppliedIndex()
	for _, id := range []string{"n1", "n2", "n3"} {
		if id == oldID {
			continue
		}
		n := c.node(id)
		waitFor(t, 10*time.Second, func() bool { return n.AppliedIndex() >= target })
		for _, want := range []*wire.LeaseGroup{g, other} {
			got, err := n.GetGroup(ctx, want.GroupID, true)
			if err != nil || len(got.Leases) != len(want.Leases) || got.Leases[0].FencingToken != want.Leases[0].FencingToken {
				t.Fatalf("%s: %+v %v", id, got, err)
			}
		}
	}
}
