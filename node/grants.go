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
		gk.rep.mu.RLock()
		rec, ok := gk.rep.f.Member(id)
		gk.rep.mu.RUnlock()
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
