package node

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"sort"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// tokenBytes is the entropy of a secret token (the contract asks >= 16).
const tokenBytes = 24

// newToken returns a fresh secret token: base64url without padding.
func newToken() string {
	b := make([]byte, tokenBytes)
	rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// newID returns prefix followed by 16 random hex digits.
func newID(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func hashToken(tok string) fsm.Hash {
	if tok == "" {
		return fsm.Hash{}
	}
	// The bytes of "token\x00" + tok, on the stack for any usual token
	// (hashToken runs for every renewal and release).
	var buf [128]byte
	return sha256.Sum256(append(append(buf[:0], "token\x00"...), tok...))
}

// fingerprint identifies what an acquire asks for, so that a replay can be
// told from a different request under the same idempotency key. wait_ms is
// left out: a retry may wait differently for the same lease.
func fingerprint(r *wire.AcquireRequest, limit uint32) fsm.Hash {
	keys := make([]string, 0, len(r.Metadata))
	for k := range r.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	meta := make([][2]string, 0, len(keys))
	for _, k := range keys {
		meta = append(meta, [2]string{k, r.Metadata[k]})
	}
	b, _ := json.Marshal([]any{r.Key, r.Holder, limit, r.TTLMS, r.SessionID, r.LockDelayMS, meta})
	return sha256.Sum256(b)
}

func seal(key []byte, token string) []byte {
	block, _ := aes.NewCipher(key)
	gcm, _ := cipher.NewGCM(block)
	nonce := make([]byte, gcm.NonceSize())
	rand.Read(nonce)
	return gcm.Seal(nonce, nonce, []byte(token), nil)
}

func unseal(key, sealed []byte) (string, bool) {
	block, _ := aes.NewCipher(key)
	gcm, _ := cipher.NewGCM(block)
	if len(sealed) < gcm.NonceSize() {
		return "", false
	}
	pt, err := gcm.Open(nil, sealed[:gcm.NonceSize()], sealed[gcm.NonceSize():], nil)
	return string(pt), err == nil
}
