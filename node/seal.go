package node

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// The sealing key. An idempotent acquire puts two values derived from
// (holder, session, idempotency key) in the log: the idempotency hash that
// names the request, and the key that seals its token (so that a replay can
// return it). Unkeyed SHA-256s of those let whoever holds the data
// directory or a backup test guessed idempotency keys offline and, on a
// hit, open the token. With a per-cluster sealing key K kept apart from
// the data directory (Config.SealKey, or derived from the gossip key) both
// are HMAC-SHA256 under K:
//
//	idempotency hash = HMAC(K, "idem\x00" holder "\x00" session "\x00" key)
//	seal key         = HMAC(K, "seal\x00" holder "\x00" session "\x00" key "\x00" hex(fingerprint))
//
// The server that proposes the acquire (the leader) computes them; the
// state machine only compares and stores the values it is given, so
// entries written before keys existed (unkeyed) replay exactly as before.
// The replicated state records a check value of K (fsm.SealCheck): a
// server whose key gives another value refuses to serve. Without any key
// the legacy unkeyed values are used.

// sealCheckBytes is the length of the recorded check value.
const sealCheckBytes = 8

// sealInfo labels the derivation of a sealing key from the gossip key.
const sealInfo = "leasehold seal key v1"

// sealer derives idempotency hashes and seal keys.
type sealer struct {
	key     []byte // nil: the unkeyed legacy scheme
	check   []byte // check value of key; nil without one
	derived bool   // key derived from the gossip key
}

func newSealer(cfg Config) (sealer, error) {
	var s sealer
	switch {
	case len(cfg.SealKey) > 0:
		s.key = bytes.Clone(cfg.SealKey)
	case len(cfg.GossipKey) > 0:
		k, err := hkdf.Key(sha256.New, cfg.GossipKey, nil, sealInfo, SealKeyBytes)
		if err != nil {
			return s, fmt.Errorf("derive the sealing key: %w", err)
		}
		s.key, s.derived = k, true
	default:
		return s, nil
	}
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("check"))
	s.check = m.Sum(nil)[:sealCheckBytes]
	return s, nil
}

// keyed reports whether a sealing key is configured.
func (s *sealer) keyed() bool { return s.key != nil }

func (s *sealer) sum(msg string) fsm.Hash {
	if s.key == nil {
		return fsm.HashOf(msg)
	}
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(msg))
	var h fsm.Hash
	copy(h[:], m.Sum(nil))
	return h
}

// idemHash names an idempotent request in the log without revealing the
// key; who is holder "\x00" session.
func (s *sealer) idemHash(who, key string) fsm.Hash {
	return s.sum("idem\x00" + who + "\x00" + key)
}

// sealKey derives the key that seals an idempotent acquire's token: only a
// requester presenting the same idempotency key and request (and, with a
// sealing key, only a server of the cluster) can open it.
func (s *sealer) sealKey(who, idemKey string, fp fsm.Hash) []byte {
	h := s.sum("seal\x00" + who + "\x00" + idemKey + "\x00" + hex.EncodeToString(fp[:]))
	return h[:]
}

// legacySealer is the unkeyed scheme of entries written before sealing keys.
var legacySealer sealer

// sealGuard checks that this server seals with the cluster's key.
type sealGuard struct {
	seal *sealer
	cfg  *Config
	log  *slog.Logger
	rep  *replica
	cl   *cluster.Cluster // set once Raft runs
	mem  *membership
	// propose commits the sealing key's check value.
	propose func(context.Context, fsm.Command) (fsm.Result, uint64, error)
	// sealRefused is set while the sealing key does not match the
	// recorded check.
	sealRefused atomic.Pointer[error]
}

// sealerFor picks the scheme of an idempotent acquire: the unkeyed legacy
// one only when a lease written before the cluster had a key still answers
// to its legacy hash (a retry across the upgrade), else this server's.
// Matching a retained legacy entry adds nothing to the log that is not in
// it already.
func (sg *sealGuard) sealerFor(who, key string) *sealer {
	if !sg.seal.keyed() {
		return sg.seal
	}
	legacy := legacySealer.idemHash(who, key)
	sg.rep.mu.RLock()
	_, found := sg.rep.f.IdemLease(legacy)
	sg.rep.mu.RUnlock()
	if found {
		return &legacySealer
	}
	return sg.seal
}

// sealIdempotent names an idempotent acquire (of a lease or a lease group)
// of holder in session with key, whose request has fingerprint fp: the
// idempotency hash the state machine indexes it by, token sealed for a
// replay, and the sealing key a replay unseals it with.
func (sg *sealGuard) sealIdempotent(holder, session, key string, fp fsm.Hash, token string) (idem fsm.Hash, sealed, sealKey []byte) {
	who := holder + "\x00" + session
	s := sg.sealerFor(who, key)
	sealKey = s.sealKey(who, key, fp)
	return s.idemHash(who, key), seal(sealKey, token), sealKey
}

// sealErr says why this server must not serve with its sealing key given
// the recorded check value rec (nil: none recorded yet); nil when it may.
func (sg *sealGuard) sealErr(rec []byte) error {
	switch {
	case rec == nil:
		return nil
	case !sg.seal.keyed():
		return fmt.Errorf("the cluster's state records a sealing key (check %x) but this server has none: "+
			"start it with the cluster's --seal-key-file (or the gossip key the cluster derives it from)", rec)
	case bytes.Equal(rec, sg.seal.check), sg.cfg.SealKeyRotate:
		return nil
	}
	return fmt.Errorf("this server's sealing key (check %x) is not the cluster's (check %x): idempotent retries "+
		"would not match and their tokens could not be opened. Start it with the cluster's --seal-key-file "+
		"(the same file on every server), or rotate the key on every server with --seal-key-rotate (docs/security.md)",
		sg.seal.check, rec)
}

// checkSeal compares this server's key with the recorded check value and
// sets or clears the refusal (refusedErr) accordingly.
func (sg *sealGuard) checkSeal() error {
	sg.rep.mu.RLock()
	rec := sg.rep.f.SealCheck()
	sg.rep.mu.RUnlock()
	err := sg.sealErr(rec)
	if err == nil {
		if sg.sealRefused.Swap(nil) != nil {
			sg.log.Info("the sealing key matches the cluster's again; serving")
		}
		return nil
	}
	if sg.sealRefused.Swap(&err) == nil {
		sg.log.Error("refusing to serve: sealing key mismatch", "err", err)
	}
	return err
}

// recordSealCheck runs on the leader (each reconcile pass): with a key, a
// state without a check value (a new cluster, one from before sealing
// keys, or a rotation with SealKeyRotate) gets this server's, once every
// server of the configuration runs a version that knows the SealCheck
// entry; a leader whose key does not match hands leadership on.
func (sg *sealGuard) recordSealCheck(ctx context.Context, conf []string) {
	if sg.checkSeal() != nil {
		sg.cl.StepDown(ctx)
		return
	}
	if !sg.seal.keyed() {
		return
	}
	sg.rep.mu.RLock()
	rec := sg.rep.f.SealCheck()
	sg.rep.mu.RUnlock()
	if bytes.Equal(rec, sg.seal.check) {
		return
	}
	for _, id := range conf {
		if id == sg.cfg.NodeID {
			continue
		}
		if p, ok := sg.mem.gossip.Peer(id); !ok || !p.SealCheck {
			return
		}
	}
	res, _, err := sg.propose(ctx, &fsm.SealCheck{Check: sg.seal.check})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			sg.log.Warn("leadership: recording the sealing key's check value failed", "err", err)
		}
		return
	}
	sg.log.Info("recorded the sealing key's check value", "check", hex.EncodeToString(sg.seal.check), "rotated", rec != nil)
}
