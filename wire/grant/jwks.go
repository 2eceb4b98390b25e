package grant

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// KeySet is the cluster's key set as GET /v1/keys serves it: a JWK Set
// (RFC 7517 section 5) with the cluster id beside the keys.
type KeySet struct {
	// ClusterID is the cluster whose grants the keys sign (a member of
	// the set that JWK libraries ignore).
	ClusterID string `json:"cluster_id,omitempty"`
	Keys      []JWK  `json:"keys"`
}

// JWK is one public key (RFC 8037: kty OKP, crv Ed25519, x the 32 bytes of
// the key in base64url) with its kid, alg and use, and Leasehold's own
// members: the server the key belongs to and, for a key that no longer
// signs, when it was retired.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg,omitempty"`
	Use string `json:"use,omitempty"`
	// ServerID is the server that signs with the key.
	ServerID string `json:"server_id,omitempty"`
	// RetiredAt is set on a retired key: when it stopped being its
	// server's current key (an estimate from the cluster clock). Grants it
	// signed before still verify while the set lists it.
	RetiredAt *time.Time `json:"retired_at,omitempty"`
}

// PublicJWK returns pub as a JWK with its thumbprint as kid.
func PublicJWK(pub ed25519.PublicKey) JWK {
	return JWK{Kty: "OKP", Crv: "Ed25519", X: b64.EncodeToString(pub), Kid: Thumbprint(pub), Alg: Alg, Use: "sig"}
}

// Thumbprint is the RFC 7638 JWK thumbprint (SHA-256, base64url) of an
// Ed25519 public key: the kid of every grant it signs.
func Thumbprint(pub ed25519.PublicKey) string {
	// The required members in lexicographic order, no white space (RFC
	// 8037 section 2: crv, kty, x).
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + b64.EncodeToString(pub) + `"}`))
	return b64.EncodeToString(sum[:])
}

// PublicKey returns the key's Ed25519 public key, checking that the JWK is
// one (kty OKP, crv Ed25519, alg EdDSA if given, use sig if given).
func (k *JWK) PublicKey() (ed25519.PublicKey, error) {
	if k.Kty != "OKP" || k.Crv != "Ed25519" {
		return nil, fmt.Errorf("key %q: kty %q crv %q, want OKP Ed25519", k.Kid, k.Kty, k.Crv)
	}
	if k.Alg != "" && k.Alg != Alg || k.Use != "" && k.Use != "sig" {
		return nil, fmt.Errorf("key %q: alg %q use %q, want EdDSA sig", k.Kid, k.Alg, k.Use)
	}
	x, err := b64.DecodeString(k.X)
	if err != nil || len(x) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("key %q: x is not %d bytes of base64url", k.Kid, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(x), nil
}

// ParseKeySet decodes a key set (GET /v1/keys, or a file holding one).
// Keys that are not Ed25519 signing keys are refused, not skipped.
func ParseKeySet(b []byte) (*KeySet, error) {
	var ks KeySet
	if err := json.Unmarshal(b, &ks); err != nil {
		return nil, fmt.Errorf("grant: key set: %w", err)
	}
	if ks.Keys == nil {
		return nil, errors.New(`grant: key set: no "keys" member`)
	}
	for i := range ks.Keys {
		if _, err := ks.Keys[i].PublicKey(); err != nil {
			return nil, fmt.Errorf("grant: key set: %w", err)
		}
	}
	return &ks, nil
}

// Key returns the key with kid, if the set has it.
func (ks *KeySet) Key(kid string) (*JWK, bool) {
	for i := range ks.Keys {
		if ks.Keys[i].Kid == kid {
			return &ks.Keys[i], true
		}
	}
	return nil, false
}

// Verify parses grant and checks it against the set: its kid names a key
// of the set and that key's signature verifies, it was issued by the
// cluster (opts.ClusterID, else the set's), and it is not past its
// expiry estimate (unless opts say otherwise). It returns the claims of a
// grant that passes; every error matches one of ErrMalformed,
// ErrUnknownKey, ErrBadSignature, ErrOtherCluster, ErrExpired.
func (ks *KeySet) Verify(grant string, opts VerifyOptions) (*Claims, error) {
	t, err := Parse(grant)
	if err != nil {
		return nil, err
	}
	return ks.verifyToken(t, opts)
}

func (ks *KeySet) verifyToken(t *Token, opts VerifyOptions) (*Claims, error) {
	k, ok := ks.Key(t.KeyID)
	if !ok {
		return nil, fmt.Errorf("%w: kid %q", ErrUnknownKey, t.KeyID)
	}
	pub, err := k.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownKey, err)
	}
	if err := t.VerifySignature(pub); err != nil {
		return nil, err
	}
	if err := opts.checkClaims(&t.Claims, ks.ClusterID); err != nil {
		return nil, err
	}
	c := t.Claims
	return &c, nil
}
