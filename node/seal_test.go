package node

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func sealKeyOf(b byte) []byte { return bytes.Repeat([]byte{b}, SealKeyBytes) }

// backupState saves a backup through the leader n and decodes its state.
func backupState(t *testing.T, n *Node) ([]byte, *fsm.FSM) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := n.SaveSnapshot(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	raw := bytes.Clone(buf.Bytes())
	_, body, err := ReadSnapshotFile(&buf)
	if err != nil {
		t.Fatal(err)
	}
	f, err := decodeSnapshotState(body)
	if err != nil {
		t.Fatal(err)
	}
	return raw, f
}

// TestSealKeyBackupRevealsNoGuess: with a sealing key, a backup holds
// neither the unkeyed SHA-256 of (holder, session, idempotency key) nor a
// token that the unkeyed seal key of the right guess opens: a guess cannot
// be verified without the key. Only the keyed values match.
func TestSealKeyBackupRevealsNoGuess(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.SealKey = sealKeyOf(7)
	n := openNode(t, cfg)
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "jobs/1", Holder: "w1", TTLMS: 60000, IdempotencyKey: "guessable-key-1"}
	l, _, err := n.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	raw, f := backupState(t, n)
	who := req.Holder + "\x00" + req.SessionID
	r := req
	r.Limit = 1
	fp := fingerprint(&r, 1)

	unkeyed := legacySealer.idemHash(who, req.IdempotencyKey)
	if bytes.Contains(raw, unkeyed[:]) {
		t.Fatal("the backup holds the unkeyed hash of the idempotency key")
	}
	if _, ok := f.IdemLease(unkeyed); ok {
		t.Fatal("the unkeyed hash of the right guess matches a lease in the backup")
	}
	rec := f.Lease(l.LeaseID)
	if rec == nil || len(rec.SealedToken()) == 0 {
		t.Fatalf("no sealed token in the backup: %+v", rec)
	}
	if _, ok := unseal(legacySealer.sealKey(who, req.IdempotencyKey, fp), rec.SealedToken()); ok {
		t.Fatal("the unkeyed seal key of the right guess opens the token in the backup")
	}
	// The keyed values are what the backup holds.
	keyed := n.seal.idemHash(who, req.IdempotencyKey)
	if !bytes.Contains(raw, keyed[:]) {
		t.Fatal("the backup does not hold the keyed hash (the test looks at the wrong bytes)")
	}
	if id, ok := f.IdemLease(keyed); !ok || id != l.LeaseID {
		t.Fatalf("keyed hash names %q %v, want %s", id, ok, l.LeaseID)
	}
	if tok, ok := unseal(n.seal.sealKey(who, req.IdempotencyKey, fp), rec.SealedToken()); !ok || tok != l.Token {
		t.Fatal("the keyed seal key does not open the token")
	}
	// Another key gives other values.
	other, err := newSealer(Config{SealKey: sealKeyOf(8)})
	if err != nil {
		t.Fatal(err)
	}
	if other.idemHash(who, req.IdempotencyKey) == keyed {
		t.Fatal("two sealing keys give the same idempotency hash")
	}
	if !bytes.Equal(f.SealCheck(), n.seal.check) {
		t.Fatalf("backup records seal check %x, want %x", f.SealCheck(), n.seal.check)
	}
}

// TestSealKeyDerivedFromGossipKey: without a sealing key the gossip key
// yields one (not the gossip key itself); without either, the legacy
// unkeyed scheme.
func TestSealKeyDerivedFromGossipKey(t *testing.T) {
	g := bytes.Repeat([]byte{3}, 32)
	s, err := newSealer(Config{GossipKey: g})
	if err != nil || !s.keyed() || !s.derived || bytes.Equal(s.key, g) || len(s.key) != SealKeyBytes {
		t.Fatalf("derived sealer %v %+v", err, s)
	}
	s2, _ := newSealer(Config{GossipKey: g})
	if !bytes.Equal(s.key, s2.key) {
		t.Fatal("derivation is not deterministic")
	}
	f, _ := newSealer(Config{GossipKey: g, SealKey: sealKeyOf(1)})
	if !bytes.Equal(f.key, sealKeyOf(1)) || f.derived {
		t.Fatal("the seal key file does not win over the gossip key")
	}
	none, _ := newSealer(Config{})
	if none.keyed() || none.check != nil || none.idemHash("a\x00", "k") != fsm.HashOf("idem\x00a\x00\x00k") {
		t.Fatal("without keys the legacy scheme is not used")
	}
}

// TestSealKeyRetryAcrossRestartAndWrongKey: on disk, an idempotent retry
// after a restart with the same key returns the same token; a restart with
// another key, or with none, refuses to start or serve with an error naming
// the sealing key; --seal-key-rotate records the new key.
func TestSealKeyRetryAcrossRestartAndWrongKey(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.SealKey = sealKeyOf(1)
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-n.Ready()
	waitFor(t, 10*time.Second, n.lt.isReady)
	waitFor(t, 30*time.Second, func() bool { return n.sealRecorded() })
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "jobs/r", Holder: "w1", TTLMS: 120000, IdempotencyKey: "retry-1"}
	l, _, err := n.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()

	// The same key: the retry is a replay with the same token.
	n2 := openNode(t, cfg)
	l2, replayed, err := n2.Acquire(ctx, req)
	if err != nil || !replayed || l2.LeaseID != l.LeaseID || l2.Token != l.Token {
		t.Fatalf("retry after restart: %v replayed=%v %+v (want token of %s)", err, replayed, l2, l.LeaseID)
	}
	// A snapshot so that the next start knows the check before any entry
	// is applied.
	if _, err := n2.bk.raftSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	n2.Close()

	for _, bad := range []struct {
		name string
		key  []byte
	}{{"another key", sealKeyOf(2)}, {"no key", nil}} {
		c := cfg
		c.SealKey = bad.key
		if err, atOpen := refusal(t, c); !atOpen || !strings.Contains(err, "sealing key") {
			t.Fatalf("%s: refusal %q (at open: %v) does not name the sealing key", bad.name, err, atOpen)
		}
	}

	// A rotation: the new key is recorded, the old one refused afterwards.
	c := cfg
	c.SealKey, c.SealKeyRotate = sealKeyOf(2), true
	n3 := openNode(t, c)
	waitFor(t, 30*time.Second, func() bool { return n3.sealRecorded() })
	if _, err := n3.bk.raftSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	n3.Close()
	if err, atOpen := refusal(t, cfg); !atOpen || !strings.Contains(err, "sealing key") {
		t.Fatalf("old key after a rotation: refusal %q (at open: %v)", err, atOpen)
	}
}

// refusal opens a node with cfg and returns the error it refuses with: from
// Open (atOpen), or from ReadyErr and a write once the check value is
// applied.
func refusal(t *testing.T, cfg Config) (msg string, atOpen bool) {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		return err.Error(), true
	}
	defer n.Close()
	waitFor(t, 30*time.Second, func() bool {
		if e := n.ReadyErr(); e != nil && strings.Contains(e.Error(), "sealing key") {
			msg = e.Error()
			return true
		}
		return false
	})
	if _, _, err := n.Acquire(context.Background(), wire.AcquireRequest{Key: "x", Holder: "h", TTLMS: 1000}); err == nil || !strings.Contains(err.Error(), "sealing key") {
		t.Fatalf("a refused server wrote: %v", err)
	}
	return msg, false
}

// sealRecorded: the state records this server's check value.
func (n *Node) sealRecorded() bool {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return bytes.Equal(n.rep.f.SealCheck(), n.seal.check)
}

// TestSealKeyLegacyEntriesStillReplay: an idempotent acquire written
// without a key (the unkeyed scheme of older logs) is replayed, same token,
// by a retry after the server restarts with a key; new acquires are keyed.
func TestSealKeyLegacyEntriesStillReplay(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.GossipAddr = "127.0.0.1:0"
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-n.Ready()
	waitFor(t, 10*time.Second, n.lt.isReady)
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "jobs/old", Holder: "w1", TTLMS: 120000, IdempotencyKey: "old-1"}
	l, _, err := n.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()

	cfg.SealKey = sealKeyOf(5)
	n2 := openNode(t, cfg)
	waitFor(t, 30*time.Second, func() bool { return n2.sealRecorded() })
	l2, replayed, err := n2.Acquire(ctx, req)
	if err != nil || !replayed || l2.LeaseID != l.LeaseID || l2.Token != l.Token {
		t.Fatalf("legacy retry with a key: %v replayed=%v %+v", err, replayed, l2)
	}
	nreq := wire.AcquireRequest{Key: "jobs/new", Holder: "w1", TTLMS: 120000, IdempotencyKey: "new-1"}
	nl, _, err := n2.Acquire(ctx, nreq)
	if err != nil {
		t.Fatal(err)
	}
	n2.rep.mu.RLock()
	_, legacyHit := n2.rep.f.IdemLease(legacySealer.idemHash("w1\x00", "new-1"))
	id, keyedHit := n2.rep.f.IdemLease(n2.seal.idemHash("w1\x00", "new-1"))
	n2.rep.mu.RUnlock()
	if legacyHit || !keyedHit || id != nl.LeaseID {
		t.Fatalf("new acquire: legacy hit %v, keyed hit %v %q", legacyHit, keyedHit, id)
	}
}

// TestSealKeyRetryAcrossFailover: three servers with one sealing key; an
// idempotent acquire's retry on the next leader, after the first one
// crashed, returns the same lease and token.
func TestSealKeyRetryAcrossFailover(t *testing.T) {
	c := newTestCluster(t)
	key := sealKeyOf(9)
	cfg1 := clusterConfig("n1")
	cfg1.SealKey = key
	n1 := c.start(cfg1)
	<-n1.Ready()
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.SealKey = key
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		c.start(cfg)
	}
	c.voters(3)
	old := c.leader()
	waitFor(t, 30*time.Second, old.sealRecorded)
	ctx := context.Background()
	req := wire.AcquireRequest{Key: "jobs/f", Holder: "w1", TTLMS: 60000, IdempotencyKey: "failover-1"}
	l, _, err := old.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	oldID := old.cfg.NodeID
	c.stop(oldID)
	nl := c.leader(oldID)
	l2, replayed, err := nl.Acquire(ctx, req)
	if err != nil || !replayed || l2.LeaseID != l.LeaseID || l2.Token != l.Token {
		t.Fatalf("retry after failover: %v replayed=%v %+v", err, replayed, l2)
	}
}

// TestSealKeyWrongKeyJoinerRefuses: a server that joins a keyed cluster
// with another key refuses to serve, with an error naming the sealing key,
// while the others keep serving.
func TestSealKeyWrongKeyJoinerRefuses(t *testing.T) {
	c := newTestCluster(t)
	cfg1 := clusterConfig("n1")
	cfg1.SealKey = sealKeyOf(4)
	n1 := c.start(cfg1)
	<-n1.Ready()
	waitFor(t, 30*time.Second, n1.sealRecorded)
	var bad *Node
	for _, id := range []string{"n2", "n3"} {
		cfg := clusterConfig(id)
		cfg.SealKey = sealKeyOf(4)
		if id == "n3" {
			cfg.SealKey = sealKeyOf(5)
		}
		cfg.Join = []string{n1.mem.Gossip().Addr()}
		n := c.start(cfg)
		if id == "n3" {
			bad = n
		}
	}
	waitFor(t, 30*time.Second, func() bool {
		e := bad.ReadyErr()
		return e != nil && strings.Contains(e.Error(), "sealing key")
	})
	ctx := context.Background()
	if _, _, err := bad.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000}); err == nil || !strings.Contains(err.Error(), "sealing key") {
		t.Fatalf("the wrong-key server wrote: %v", err)
	}
	if _, _, err := c.leader("n3").Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000, IdempotencyKey: "i"}); err != nil {
		t.Fatal(err)
	}
}
