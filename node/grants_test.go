package node

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// waitGrantKey waits until n may sign grants (its key is recorded).
func waitGrantKey(t *testing.T, n *Node) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool { return n.gk.usable() == nil })
}

func keySet(t *testing.T, n *Node, stale bool) *grant.KeySet {
	t.Helper()
	ks, err := n.GrantKeys(context.Background(), stale)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func verify(t *testing.T, ks *grant.KeySet, g string) *grant.Claims {
	t.Helper()
	c, err := ks.Verify(g, grant.VerifyOptions{})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return c
}

// checkClaims compares a grant's claims with the lease it came with.
func checkClaims(t *testing.T, c *grant.Claims, l *wire.Lease, cluster, server string, signedAt time.Time) {
	t.Helper()
	if c.ClusterID != cluster || c.ServerID != server || c.Key != l.Key || c.LeaseID != l.LeaseID || c.Holder != l.Holder ||
		c.FencingToken != l.FencingToken || c.Limit != l.Limit || c.SessionID != l.SessionID || c.TTLMS != l.TTLMS {
		t.Fatalf("claims %+v do not match lease %+v (cluster %s, server %s)", c, l, cluster, server)
	}
	if d := c.IssuedTime().Sub(signedAt); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("iat %v, signed about %v", c.IssuedTime(), signedAt)
	}
	if d := c.ExpiryTime().Sub(c.IssuedTime()) - time.Duration(l.RemainingMS)*time.Millisecond; d < -time.Second || d > time.Second {
		t.Fatalf("exp - iat = %v, remaining %d ms", c.ExpiryTime().Sub(c.IssuedTime()), l.RemainingMS)
	}
}

// TestGrants: an acquire or renewal that asks for a grant gets one that
// verifies against the node's key set and states the lease; one that does
// not ask gets none; the holder gets one by GET with its lease token (or
// its session's for a bound lease); a wrong or missing token, an unknown
// lease and an ended lease get errors and no grant; an idempotent replay of
// an ended lease gets none.
func TestGrants(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	waitGrantKey(t, n)
	ctx := context.Background()
	ks := keySet(t, n, false)
	cid := n.mem.ClusterID()
	if ks.ClusterID == "" || ks.ClusterID != cid || len(ks.Keys) != 1 || ks.Keys[0].Kid != n.GrantKeyID() ||
		ks.Keys[0].ServerID != "n1" || ks.Keys[0].RetiredAt != nil {
		t.Fatalf("key set %+v (cluster %q, kid %s)", ks, cid, n.GrantKeyID())
	}

	plain, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "plain", Holder: "w1", TTLMS: 5000})
	if err != nil || plain.Grant != "" {
		t.Fatalf("acquire without grant: %+v %v", plain, err)
	}
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/7", Holder: "w1", TTLMS: 5000, Grant: true, IdempotencyKey: "i1"})
	if err != nil || l.Grant == "" {
		t.Fatalf("acquire with grant: %+v %v", l, err)
	}
	checkClaims(t, verify(t, ks, l.Grant), l, cid, "n1", time.Now())

	r, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, TTLMS: 8000, Grant: true})
	if err != nil || r.Grant == "" || r.TTLMS != 8000 {
		t.Fatalf("renew with grant: %+v %v", r, err)
	}
	checkClaims(t, verify(t, ks, r.Grant), r, cid, "n1", time.Now())
	if r, err := n.Renew(ctx, l.LeaseID, l.Token, 0); err != nil || r.Grant != "" {
		t.Fatalf("renew without grant: %+v %v", r, err)
	}

	g, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token}, false)
	if err != nil || g.Grant == "" || g.Token != "" {
		t.Fatalf("holder's read: %+v %v", g, err)
	}
	checkClaims(t, verify(t, ks, g.Grant), g, cid, "n1", time.Now())
	if g, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token}, true); err != nil || g.Grant == "" {
		t.Fatalf("holder's stale read: %+v %v", g, err)
	}

	// A semaphore's slot names the limit; a bound lease its session and
	// the session's TTL, and its holder may show the session's token.
	sem, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuners", Holder: "w2", TTLMS: 5000, Limit: 3, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := verify(t, ks, sem.Grant); c.Limit != 3 {
		t.Fatalf("semaphore grant limit %d", c.Limit)
	}
	s, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "w3", TTLMS: 4000})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "bound", SessionID: s.SessionID, SessionToken: s.Token, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := verify(t, ks, b.Grant); c.SessionID != s.SessionID || c.TTLMS != 4000 || c.Holder != "w3" {
		t.Fatalf("bound grant %+v", c)
	}
	if g, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: b.LeaseID, SessionToken: s.Token}, false); err != nil || g.Grant == "" {
		t.Fatalf("bound lease by session token: %+v %v", g, err)
	}

	// Refusals.
	for name, c := range map[string]struct {
		req  wire.GrantRequest
		code wire.Code
	}{
		"no token":              {wire.GrantRequest{LeaseID: l.LeaseID}, wire.CodeInvalidArgument},
		"wrong token":           {wire.GrantRequest{LeaseID: l.LeaseID, Token: "nope"}, wire.CodeLeaseTokenInvalid},
		"another lease's token": {wire.GrantRequest{LeaseID: l.LeaseID, Token: plain.Token}, wire.CodeLeaseTokenInvalid},
		"a session's token for a standalone lease": {wire.GrantRequest{LeaseID: l.LeaseID, SessionToken: s.Token}, wire.CodeLeaseTokenInvalid},
		"unknown lease": {wire.GrantRequest{LeaseID: "ls_0000000000000000", Token: l.Token}, wire.CodeLeaseNotFound},
		"empty id":      {wire.GrantRequest{Token: l.Token}, wire.CodeLeaseNotFound},
	} {
		if g, err := n.LeaseGrant(ctx, c.req, false); wire.ErrorCode(err) != c.code || g != nil {
			t.Errorf("%s: %+v %v, want %s", name, g, err, c.code)
		}
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if g, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token}, false); wire.ErrorCode(err) != wire.CodeLeaseReleased || g != nil {
		t.Fatalf("released lease: %+v %v", g, err)
	}
	if _, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Grant: true}); wire.ErrorCode(err) != wire.CodeLeaseReleased {
		t.Fatalf("renew of a released lease: %v", err)
	}
	// The idempotent replay answers the ended lease, without a grant.
	rp, replayed, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/7", Holder: "w1", TTLMS: 5000, Grant: true, IdempotencyKey: "i1"})
	if err != nil || !replayed || rp.State != "released" || rp.Grant != "" {
		t.Fatalf("replay of an ended lease: %+v replayed %v %v", rp, replayed, err)
	}
}

// TestGrantsOlderServer: while a server of the configuration runs a
// version without grants, no key is recorded: an acquire or renewal that
// asks for a grant is refused with UNAVAILABLE and changes nothing (no
// lease, no fencing token used), and the key set is empty; without a grant
// everything goes on.
func TestGrantsOlderServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.olderPeer = true
	n := openNode(t, cfg)
	ctx := context.Background()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	// What is checked is that nothing is recorded: a reconcile pass or
	// more (one a second) has its chance to, were it wrong.
	time.Sleep(1500 * time.Millisecond)
	fence := n.rep.fence()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "g", Holder: "w1", TTLMS: 5000, Grant: true}); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("acquire with grant: %v", err)
	}
	if _, err := n.RenewWith(ctx, wire.RenewRequest{LeaseID: l.LeaseID, Token: l.Token, Grant: true}); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("renew with grant: %v", err)
	}
	if _, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token}, false); wire.ErrorCode(err) != wire.CodeUnavailable {
		t.Fatalf("holder's read: %v", err)
	}
	if list, err := n.ListLeases(ctx, wire.ListRequest{Key: "g"}, false); err != nil || len(list.Leases) != 0 || n.rep.fence() != fence {
		t.Fatalf("a refused acquire left %+v (fence %d -> %d)", list, fence, n.rep.fence())
	}
	if g, err := n.GetLease(ctx, l.LeaseID, false); err != nil || g.RenewalCount != 0 {
		t.Fatalf("a refused renewal renewed: %+v %v", g, err)
	}
	if ks := keySet(t, n, false); len(ks.Keys) != 0 {
		t.Fatalf("key set %+v", ks)
	}
	if _, err := n.Renew(ctx, l.LeaseID, l.Token, 0); err != nil {
		t.Fatal(err)
	}
}

// lockedBuf is a bytes.Buffer that several goroutines write.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

func (l *lockedBuf) String() string { return string(l.Bytes()) }

func (r *replica) fence() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.f.Fence()
}

// TestGrantKeyRotation: a server's key is made once in its data directory
// (0600) and kept across restarts; a restart with another key (here: the
// key file replaced) records the new key, and the old one stays in the key
// set, retired, so its grants still verify, until GrantKeyRetention has
// passed on the cluster clock; then they fail. Neither the private key nor
// its seed appears in the log, the Raft data or the node's log lines.
func TestGrantKeyRotation(t *testing.T) {
	dir := t.TempDir()
	logs := &lockedBuf{}
	cfg := testConfig(t, dir)
	// The retention is counted on the cluster clock, which never runs
	// faster than real time: the key set read right after the rotation
	// lists the retired key for certain if it is read within the retention
	// of the restart. 10 s leaves that read a loaded machine's stalls.
	const retention = 10 * time.Second
	cfg.GrantKeyRetention = retention
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()

	n := openNode(t, cfg)
	waitGrantKey(t, n)
	kid1 := n.GrantKeyID()
	path := filepath.Join(dir, GrantKeyFile)
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	priv1, err := grant.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()

	// The same key after a restart: nothing to record, nothing retired.
	n = openNode(t, cfg)
	waitGrantKey(t, n)
	if n.GrantKeyID() != kid1 || len(keySet(t, n, false).Keys) != 1 {
		t.Fatalf("restart changed the key: %s, set %+v", n.GrantKeyID(), keySet(t, n, false))
	}
	n.Close()

	// Rotation: a new key in the file.
	if err := os.WriteFile(path, grant.MarshalPrivateKey(grant.GenerateKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	n = openNode(t, cfg)
	waitGrantKey(t, n)
	kid2 := n.GrantKeyID()
	if kid2 == kid1 {
		t.Fatal("the key did not change")
	}
	ks := keySet(t, n, false)
	read := time.Now()
	if len(ks.Keys) != 2 && read.Sub(rotated) >= retention {
		t.Fatalf("the key set was read %v after the restart, not within the retention %v (raise it): %+v", read.Sub(rotated), retention, ks)
	}
	if len(ks.Keys) != 2 || ks.Keys[0].Kid != kid2 || ks.Keys[0].RetiredAt != nil || ks.Keys[1].Kid != kid1 || ks.Keys[1].RetiredAt == nil {
		t.Fatalf("key set after rotation %+v", ks)
	}
	// retired_at: the read's now less the ticks since the retirement
	// (recorded during the restart), so between the restart and the read,
	// give or take a tick and the rounding to milliseconds.
	if at := *ks.Keys[1].RetiredAt; at.Before(rotated.Add(-time.Second)) || at.After(read.Add(time.Second)) {
		t.Fatalf("retired_at %v, want between the restart (%v) and the read (%v)", at, rotated, read)
	}
	old := verify(t, ks, l.Grant)
	if old.LeaseID != l.LeaseID {
		t.Fatalf("old grant %+v", old)
	}
	g, err := n.LeaseGrant(ctx, wire.GrantRequest{LeaseID: l.LeaseID, Token: l.Token}, false)
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := grant.Parse(g.Grant); tok.KeyID != kid2 {
		t.Fatalf("a new grant signed by %s, want %s", tok.KeyID, kid2)
	}
	// Past the retention, the retired key is gone and its grants fail.
	waitFor(t, retention+60*time.Second, func() bool { return len(keySet(t, n, false).Keys) == 1 })
	if _, err := keySet(t, n, false).Verify(l.Grant, grant.VerifyOptions{}); !errors.Is(err, grant.ErrUnknownKey) {
		t.Fatalf("a grant of a key retired past the retention: %v", err)
	}
	verify(t, keySet(t, n, false), g.Grant)
	n.Close()

	// The private key is in grant.key only.
	seed := priv1.Seed()
	needles := [][]byte{seed, []byte(base64.StdEncoding.EncodeToString(seed)), []byte(base64.RawURLEncoding.EncodeToString(seed)),
		[]byte(base64.StdEncoding.EncodeToString(priv1)[:40])}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == path {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, nd := range needles {
			if bytes.Contains(b, nd) {
				t.Errorf("%s holds the private key", p)
			}
		}
		return nil
	})
	for _, nd := range append(needles, []byte("PRIVATE KEY")) {
		if bytes.Contains(logs.Bytes(), nd) {
			t.Error("the node's log shows the private key")
		}
	}
	if !strings.Contains(logs.String(), "recorded a grant signing key") || !strings.Contains(logs.String(), kid1) {
		t.Errorf("the log does not say which key was recorded:\n%s", logs.String())
	}
}

// TestGrantOtherCluster: a grant of another cluster fails against this
// cluster's key set: its kid is unknown, and even when both clusters' servers
// were given the same key, its cluster id differs.
func TestGrantOtherCluster(t *testing.T) {
	shared := grant.GenerateKey()
	ctx := context.Background()
	var sets []*grant.KeySet
	var grants []string
	for _, key := range []ed25519.PrivateKey{nil, shared, shared} {
		cfg := testConfig(t, "")
		cfg.GrantKey = key
		n := openNode(t, cfg)
		waitGrantKey(t, n)
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w", TTLMS: 5000, Grant: true})
		if err != nil {
			t.Fatal(err)
		}
		sets, grants = append(sets, keySet(t, n, false)), append(grants, l.Grant)
		verify(t, sets[len(sets)-1], l.Grant)
	}
	if sets[1].ClusterID == sets[2].ClusterID || sets[1].Keys[0].Kid != sets[2].Keys[0].Kid {
		t.Fatalf("sets %+v %+v", sets[1], sets[2])
	}
	if _, err := sets[0].Verify(grants[1], grant.VerifyOptions{}); !errors.Is(err, grant.ErrUnknownKey) {
		t.Fatalf("another cluster's key: %v", err)
	}
	if _, err := sets[1].Verify(grants[2], grant.VerifyOptions{}); !errors.Is(err, grant.ErrOtherCluster) {
		t.Fatalf("another cluster with the same key: %v", err)
	}
}

// TestClusterGrants: on three servers, the leader records every server's
// key; each server signs with its own; a grant any of them signed
// verifies against the key set any of them serves; a removed server's key
// is listed as retired, so its grants still verify.
func TestClusterGrants(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	ids := []string{"n1", "n2", "n3"}
	for _, id := range ids {
		waitGrantKey(t, c.node(id))
	}
	var follower *Node
	for _, id := range ids {
		if id != l.cfg.NodeID {
			follower = c.node(id)
		}
	}
	ks := keySet(t, l, false)
	if len(ks.Keys) != 3 {
		t.Fatalf("key set %+v", ks)
	}
	for i, k := range ks.Keys {
		if k.ServerID != ids[i] || k.Kid != c.node(ids[i]).GrantKeyID() || k.RetiredAt != nil {
			t.Fatalf("key %d: %+v", i, k)
		}
	}
	if fs := keySet(t, follower, true); len(fs.Keys) != 3 || fs.ClusterID != ks.ClusterID {
		t.Fatalf("the follower's key set %+v", fs)
	}
	lease, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "w1", TTLMS: 60000, Grant: true})
	if err != nil {
		t.Fatal(err)
	}
	checkClaims(t, verify(t, ks, lease.Grant), lease, ks.ClusterID, l.cfg.NodeID, time.Now())
	// A follower answers a stale read itself, signing with its own key.
	waitFor(t, 5*time.Second, func() bool { _, err := follower.GetLease(ctx, lease.LeaseID, true); return err == nil })
	fg, err := follower.LeaseGrant(ctx, wire.GrantRequest{LeaseID: lease.LeaseID, Token: lease.Token}, true)
	if err != nil {
		t.Fatal(err)
	}
	if c := verify(t, ks, fg.Grant); c.ServerID != follower.cfg.NodeID || c.FencingToken != lease.FencingToken {
		t.Fatalf("the follower's grant %+v", c)
	}
	// Removing the follower retires its key.
	if err := l.RemoveMember(ctx, follower.cfg.NodeID); err != nil {
		t.Fatal(err)
	}
	ks = keySet(t, l, false)
	if len(ks.Keys) != 3 {
		t.Fatalf("key set after the removal %+v", ks)
	}
	for _, k := range ks.Keys {
		if (k.ServerID == follower.cfg.NodeID) != (k.RetiredAt != nil) {
			t.Fatalf("after removing %s: %+v", follower.cfg.NodeID, k)
		}
	}
	verify(t, ks, fg.Grant)
}
