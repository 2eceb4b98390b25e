package grant

import (
	"bytes"
	"cmp"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Alg is the JWS algorithm of every grant (RFC 8037: EdDSA with Ed25519).
const Alg = "EdDSA"

// Type is the "typ" header of every grant (explicit typing, RFC 8725
// section 3.11), so that no other JWT signed by the same key passes for a
// grant.
const Type = "leasehold-grant+jwt"

// MaxTokenBytes bounds a grant that Parse accepts. A grant is about 600
// bytes; keys (512 bytes) and holders (128) are bounded.
const MaxTokenBytes = 8 << 10

// Claims are what a grant states. The JSON names are the claim names.
type Claims struct {
	// ClusterID is the identity of the cluster that granted the lease
	// (the issuer, "iss").
	ClusterID string `json:"iss"`
	// IssuedAt and Expiry are Unix seconds: the signing server's wall
	// clock when it signed, and that plus the lease's remaining time,
	// rounded down. Estimates, never a safety bound (see the package doc).
	IssuedAt int64 `json:"iat"`
	Expiry   int64 `json:"exp"`
	// ServerID is the server that signed the grant.
	ServerID string `json:"server_id"`
	Key      string `json:"key"`
	LeaseID  string `json:"lease_id"`
	Holder   string `json:"holder"`
	// FencingToken is the lease's fencing token: strictly increasing per
	// key across the cluster's life.
	FencingToken uint64 `json:"fencing_token"`
	// Limit is the key's number of slots (1: exclusive; N > 1: a
	// semaphore, of which the lease is one slot; slots are not numbered,
	// each slot's lease has its own fencing token).
	Limit uint32 `json:"limit"`
	// SessionID is set when the lease is bound to a session (its TTL is
	// then the session's).
	SessionID string `json:"session_id,omitempty"`
	// TTLMS is the lease's TTL in milliseconds.
	TTLMS int64 `json:"ttl_ms"`
}

// IssuedTime and ExpiryTime are IssuedAt and Expiry as times.
func (c *Claims) IssuedTime() time.Time { return time.Unix(c.IssuedAt, 0) }
func (c *Claims) ExpiryTime() time.Time { return time.Unix(c.Expiry, 0) }

// check reports the first claim that is missing or out of range.
func (c *Claims) check() error {
	switch {
	case c.ClusterID == "":
		return fmt.Errorf("%w: no iss (cluster id)", ErrMalformed)
	case c.Key == "":
		return fmt.Errorf("%w: no key", ErrMalformed)
	case c.LeaseID == "":
		return fmt.Errorf("%w: no lease_id", ErrMalformed)
	case c.Holder == "":
		return fmt.Errorf("%w: no holder", ErrMalformed)
	case c.FencingToken == 0:
		return fmt.Errorf("%w: no fencing_token", ErrMalformed)
	case c.Limit == 0:
		return fmt.Errorf("%w: no limit", ErrMalformed)
	case c.IssuedAt <= 0 || c.Expiry < c.IssuedAt:
		return fmt.Errorf("%w: iat %d and exp %d out of order", ErrMalformed, c.IssuedAt, c.Expiry)
	}
	return nil
}

// Verification errors. Every error of Parse and Verify matches (errors.Is)
// one of them, with details in its message.
var (
	// ErrMalformed: not a grant (framing, encoding, header, missing
	// claims).
	ErrMalformed = errors.New("grant: malformed")
	// ErrBadSignature: the signature does not verify with the key the
	// header names: forged, or altered after signing.
	ErrBadSignature = errors.New("grant: bad signature")
	// ErrUnknownKey: the key set has no key with the grant's kid (never
	// the cluster's, or retired too long ago).
	ErrUnknownKey = errors.New("grant: signed by a key not in the key set")
	// ErrOtherCluster: issued by another cluster than the one expected.
	ErrOtherCluster = errors.New("grant: issued by another cluster")
	// ErrExpired: past its expiry estimate (plus the leeway).
	ErrExpired = errors.New("grant: past its expiry estimate")
)

var b64 = base64.RawURLEncoding.Strict()

// header is a grant's JOSE header.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	Typ string `json:"typ"`
}

// Signer signs grants with one Ed25519 key. It is safe for concurrent use.
type Signer struct {
	priv ed25519.PrivateKey
	kid  string
	hdr  string // base64url of the header, with the dot
}

// NewSigner returns a signer for priv; its key id is the thumbprint of the
// public key.
func NewSigner(priv ed25519.PrivateKey) *Signer {
	pub := priv.Public().(ed25519.PublicKey)
	kid := Thumbprint(pub)
	h, _ := json.Marshal(header{Alg: Alg, Kid: kid, Typ: Type})
	return &Signer{priv: priv, kid: kid, hdr: b64.EncodeToString(h) + "."}
}

// KeyID is the signer's kid.
func (s *Signer) KeyID() string { return s.kid }

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// Sign returns the compact JWS of c.
func (s *Signer) Sign(c *Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	n := len(s.hdr) + b64.EncodedLen(len(payload))
	buf := make([]byte, 0, n+1+b64.EncodedLen(ed25519.SignatureSize))
	buf = append(buf, s.hdr...)
	buf = b64.AppendEncode(buf, payload)
	sig := ed25519.Sign(s.priv, buf)
	buf = append(buf, '.')
	buf = b64.AppendEncode(buf, sig)
	return string(buf), nil
}

// Token is a parsed grant whose signature is not checked yet.
type Token struct {
	// KeyID is the kid of the header: the key that should verify it.
	KeyID  string
	Claims Claims
	signed []byte // header.payload, as signed
	sig    []byte
}

// Parse splits and decodes a compact JWS grant, checking its header (alg
// EdDSA, typ Type, a kid, nothing else it would have to understand) and
// its claims (the ones every grant has), but not its signature: Verify
// does that.
func Parse(s string) (*Token, error) {
	if len(s) > MaxTokenBytes {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrMalformed, len(s), MaxTokenBytes)
	}
	s = strings.TrimSpace(s)
	h, rest, ok1 := strings.Cut(s, ".")
	p, sg, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(sg, ".") {
		return nil, fmt.Errorf("%w: not a compact JWS (three base64url parts joined by dots)", ErrMalformed)
	}
	hb, err := b64.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%w: header is not base64url: %v", ErrMalformed, err)
	}
	var hdr header
	if err := strictJSON(hb, &hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	if hdr.Alg != Alg {
		return nil, fmt.Errorf("%w: alg %q, want %q", ErrMalformed, hdr.Alg, Alg)
	}
	if hdr.Typ != Type {
		return nil, fmt.Errorf("%w: typ %q, want %q", ErrMalformed, hdr.Typ, Type)
	}
	if hdr.Kid == "" {
		return nil, fmt.Errorf("%w: no kid", ErrMalformed)
	}
	pb, err := b64.DecodeString(p)
	if err != nil {
		return nil, fmt.Errorf("%w: payload is not base64url: %v", ErrMalformed, err)
	}
	t := &Token{KeyID: hdr.Kid, signed: []byte(s[:len(h)+1+len(p)])}
	// Claims it does not know are allowed (a newer server may add some).
	dec := json.NewDecoder(bytes.NewReader(pb))
	if err := dec.Decode(&t.Claims); err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the claims", ErrMalformed)
	}
	if err := t.Claims.check(); err != nil {
		return nil, err
	}
	if t.sig, err = b64.DecodeString(sg); err != nil || len(t.sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: the signature is not %d bytes of base64url", ErrMalformed, ed25519.SignatureSize)
	}
	return t, nil
}

// strictJSON decodes one JSON object into v, refusing unknown fields (a
// header member such as "crit" that the verifier would have to honour) and
// anything after it.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the object")
	}
	return nil
}

// VerifySignature checks the token's signature with pub.
func (t *Token) VerifySignature(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: public key of %d bytes", ErrBadSignature, len(pub))
	}
	if !ed25519.Verify(pub, t.signed, t.sig) {
		return ErrBadSignature
	}
	return nil
}

// VerifyOptions say what Verify checks besides the signature.
type VerifyOptions struct {
	// ClusterID is the cluster whose grants are accepted; empty: the
	// cluster id of the key set (a key set without one is refused).
	ClusterID string
	// Now is the clock the expiry estimate is compared with; nil:
	// time.Now.
	Now func() time.Time
	// Leeway is how far past exp a grant is still accepted (clock skew
	// between the signing server and the verifier). Default 0.
	Leeway time.Duration
	// IgnoreExpiry accepts grants past exp (the fencing token alone then
	// tells stale holders apart).
	IgnoreExpiry bool
}

// checkClaims applies opts to verified claims; cluster is the key set's
// cluster id.
func (opts *VerifyOptions) checkClaims(c *Claims, cluster string) error {
	want := cmp.Or(opts.ClusterID, cluster)
	if want == "" {
		return fmt.Errorf("%w: no cluster id to check the grant against (the key set names none; set VerifyOptions.ClusterID)", ErrOtherCluster)
	}
	if c.ClusterID != want {
		return fmt.Errorf("%w: issued by cluster %q, want %q", ErrOtherCluster, c.ClusterID, want)
	}
	if opts.IgnoreExpiry {
		return nil
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	if t := now(); t.After(c.ExpiryTime().Add(opts.Leeway)) {
		return fmt.Errorf("%w: exp %s, now %s", ErrExpired, c.ExpiryTime().UTC().Format(time.RFC3339), t.UTC().Format(time.RFC3339))
	}
	return nil
}
