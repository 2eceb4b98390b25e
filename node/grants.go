package node

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
	"github.com/leasehold/leasehold/wire/grant"
)

// Grants (package grant): on request, the answer of an acquire, a renewal or
// a holder's read of its lease carries a JWS in which this server states
// that the cluster granted the lease. Each server signs with a key of its
// own: Config.GrantKey, else the key in DataDir/grant.key (made at first
// start, mode 0600), else (InMemory) a new key per process. The private key
// never leaves the process: only its public half is gossiped (Meta.GrantKey)
// and recorded, by the leader, in the server's member record (a MemberKey
// entry), once every server of the configuration reads such entries. A
// server signs only with a key the replicated registry records as its
// current one, so that every grant it hands out verifies against the key
// set any server serves (GET /v1/keys). Signing happens after the operation
// committed, outside the state machine, on the server that answers.

// GrantKeyFile is the name of the signing key file in the data directory.
const GrantKeyFile = "grant.key"

// grantKeys is this server's grant signing key.
type grantKeys struct {
	signer *grant.Signer
	pub    fsm.GrantKey
	pubB64 string // as gossiped

	cfg *Config
	log *slog.Logger
	rep *replica
	mem *membership
	rc  *reconciler // the member records
	// propose commits the servers' keys (recordKeys).
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
}

// loadGrantKey returns the signing key of cfg: GrantKey, the data
// directory's key file (made when missing), or a new key for an in-memory
// node.
func loadGrantKey(cfg Config, log *slog.Logger) (*grantKeys, error) {
	priv := cfg.GrantKey
	switch {
	case priv != nil:
	case cfg.InMemory:
		priv = grant.GenerateKey()
	default:
		path := filepath.Join(cfg.DataDir, GrantKeyFile)
		k, created, err := grant.LoadOrCreateKeyFile(path)
		if err != nil {
			return nil, fmt.Errorf("grant signing key: %w", err)
		}
		priv = k
		if created {
			log.Info("made a grant signing key", "file", path, "kid", grant.Thumbprint(k.Public().(ed25519.PublicKey)))
		}
	}
	gk := &grantKeys{signer: grant.NewSigner(priv)}
	copy(gk.pub[:], gk.signer.Public())
	gk.pubB64 = base64.RawURLEncoding.EncodeToString(gk.pub[:])
	return gk, nil
}

// kid is this server's key id.
func (gk *grantKeys) kid() string { return gk.signer.KeyID() }

// usable is nil when this server may sign: the replicated state names the
// cluster and records this server's key as its current one. Otherwise a
// grant cannot be given now (UNAVAILABLE: retry), and a request that asks
// for one is refused before anything changes.
func (gk *grantKeys) usable() error {
	gk.rep.mu.RLock()
	id := gk.rep.f.ClusterID()
	rec, ok := gk.rep.f.Member(gk.cfg.NodeID)
	gk.rep.mu.RUnlock()
	if id == "" {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "the cluster has no identity yet, so no grant can name it; retry shortly; nothing changed"}
	}
	if !ok || rec.GrantKeys == nil || rec.GrantKeys.Current != gk.pub {
		return &wire.Error{Code: wire.CodeUnavailable, Message: "this server's grant signing key is not recorded in the cluster yet " +
			"(the leader records it once every server runs a version with grants); retry shortly; nothing changed"}
	}
	return nil
}

// sign returns the grant of lease l, which must be active, as this server
// rendered it at now. The cluster id is the replicated one.
func (gk *grantKeys) sign(l *wire.Lease, now time.Time) string {
	gk.rep.mu.RLock()
	cid := gk.rep.f.ClusterID()
	gk.rep.mu.RUnlock()
	c := grant.Claims{ClusterID: cid, IssuedAt: now.Unix(), Expiry: (now.UnixMilli() + max(l.RemainingMS, 0)) / 1000,
		ServerID: gk.cfg.NodeID, Key: l.Key, LeaseID: l.LeaseID, Holder: l.Holder, FencingToken: l.FencingToken,
		Limit: l.Limit, SessionID: l.SessionID, TTLMS: l.TTLMS}
	g, err := gk.signer.Sign(&c)
	if err != nil {
		gk.log.Error("signing a grant failed", "lease", l.LeaseID, "err", err)
		return ""
	}
	return g
}

// attach signs a grant into v when v is active (an idempotent replay of an
// acquire may answer an ended lease: it gets none).
func (gk *grantKeys) attach(v *wire.Lease) {
	if v.State == fsm.StateActive.String() {
		v.Grant = gk.sign(v, wallNow())
	}
}

// recordKeys, on the leader, records the gossiped grant key of every
// server of the configuration (ids) whose member record lacks it, once
// every server announces one (so reads MemberKey entries).
func (gk *grantKeys) recordKeys(ctx context.Context, ids []string) {
	if gk.cfg.olderPeer || !everyPeer(gk.cfg.NodeID, ids, gk.mem.gossip.Peer, func(p cluster.Peer) bool { return p.GrantKey != "" }) {
		return
	}
	for _, id := range ids {
		key, inc := gk.pub, gk.mem.incarnation
		if id != gk.cfg.NodeID {
			p, ok := gk.mem.gossip.Peer(id)
			if !ok || p.Status != "alive" {
				continue
			}
			b, err := base64.RawURLEncoding.Strict().DecodeString(p.GrantKey)
			if err != nil || len(b) != fsm.GrantKeyBytes {
				gk.log.Warn("a server gossips a grant key that is not an Ed25519 public key; not recording it", "server", id)
				continue
			}
			key, inc = fsm.GrantKey(b), p.Incarnation
		}
		rec, ok := gk.rc.memberRecord(id)
		if !ok || rec.Removed || rec.Incarnation != inc || key.IsZero() ||
			rec.GrantKeys != nil && rec.GrantKeys.Current == key {
			continue
		}
		res, _, err := gk.propose(ctx, &fsm.MemberKey{ID: id, Key: key})
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err != nil {
			gk.log.Warn("recording a grant signing key failed", "server", id, "err", err)
			continue
		}
		gk.log.Info("recorded a grant signing key", "server", id, "kid", grant.Thumbprint(key[:]))
	}
}

// GrantKeys returns the cluster's key set (GET /v1/keys): every server's
// current grant signing key and the keys retired less than
// Config.GrantKeyRetention ago (by the cluster clock), each once. Linearizable
// unless stale.
func (n *Node) GrantKeys(ctx context.Context, stale bool) (*grant.KeySet, error) {
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	members := n.rep.f.Members()
	tick, period, cid := n.rep.f.Tick(), n.rep.period(), n.rep.f.ClusterID()
	n.rep.mu.RUnlock()
	ks := &grant.KeySet{ClusterID: cid, Keys: []grant.JWK{}}
	seen := map[string]bool{}
	add := func(k fsm.GrantKey, server string, retired *time.Time) {
		jwk := grant.PublicJWK(k[:])
		if seen[jwk.Kid] {
			return
		}
		seen[jwk.Kid] = true
		jwk.ServerID, jwk.RetiredAt = server, retired
		ks.Keys = append(ks.Keys, jwk)
	}
	// Current keys first, so that a key some server still signs with is
	// never listed as retired.
	for _, m := range members {
		if m.GrantKeys != nil && !m.GrantKeys.Current.IsZero() {
			add(m.GrantKeys.Current, m.ID, nil)
		}
	}
	now := wallNow()
	for _, m := range members {
		if m.GrantKeys == nil {
			continue
		}
		for _, r := range m.GrantKeys.Retired {
			age := time.Duration(tick-min(r.Tick, tick)) * time.Duration(period) * time.Millisecond
			if age >= n.cfg.GrantKeyRetention {
				continue
			}
			at := now.Add(-age).UTC().Truncate(time.Second)
			add(r.Key, m.ID, &at)
		}
	}
	return ks, nil
}

// LeaseGrant returns lease r.LeaseID, as GetLease does, with a grant signed
// by this server, to its holder: r.Token must be the lease's token (or,
// for a lease bound to a session, r.SessionToken the session's). Only an
// active lease gets a grant; an ended one is refused with its state's code
// (LEASE_EXPIRED, LEASE_RELEASED, LEASE_REVOKED). Linearizable unless
// stale (a stale grant states what this server has applied).
func (n *Node) LeaseGrant(ctx context.Context, r wire.GrantRequest, stale bool) (*wire.Lease, error) {
	if err := checkID("lease", r.LeaseID); err != nil {
		return nil, err
	}
	if r.Token == "" && r.SessionToken == "" {
		return nil, fsm.InvalidField("token", "a grant is given to the lease's holder: the lease token (X-Lease-Token) or, for a bound lease, the session token is required")
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	if err := n.gk.usable(); err != nil {
		return nil, err
	}
	now := wallNow()
	n.rep.mu.RLock()
	l := n.rep.f.Lease(r.LeaseID)
	var v *wire.Lease
	ok := false
	if l != nil {
		ok = r.Token != "" && hashToken(r.Token) == l.TokenHash
		if !ok && r.SessionToken != "" && l.SessionID != "" {
			s := n.rep.f.Session(l.SessionID)
			ok = s != nil && hashToken(r.SessionToken) == s.TokenHash
		}
		v = n.rep.view(l, now)
	}
	n.rep.mu.RUnlock()
	switch {
	case l == nil:
		return nil, fsm.Errorf(wire.CodeLeaseNotFound, "lease %s not found", r.LeaseID)
	case !ok:
		return nil, fsm.Errorf(wire.CodeLeaseTokenInvalid, "wrong lease token for lease %s", r.LeaseID)
	case v.State != fsm.StateActive.String():
		return nil, fsm.Errorf(endedCode(v.State), "lease %s is %s: a grant is given for an active lease only", r.LeaseID, v.State)
	}
	v.Grant = n.gk.sign(v, now)
	return v, nil
}

// endedCode is the error code of an operation on a lease in an ended state.
func endedCode(state string) wire.Code {
	switch st, _ := fsm.ParseState(state); st {
	case fsm.StateReleased:
		return wire.CodeLeaseReleased
	case fsm.StateRevoked:
		return wire.CodeLeaseRevoked
	}
	return wire.CodeLeaseExpired
}

// GrantKeyID is the key id (RFC 7638 thumbprint) of this server's grant
// signing key.
func (n *Node) GrantKeyID() string { return n.gk.kid() }
