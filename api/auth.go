package api

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/leasehold/leasehold/wire"
)

// Scope is what a bearer token may do. Scopes are ordered: admin implies
// write, write implies read.
type Scope int

// The scopes, weakest first. ScopeNone marks the open routes (/healthz,
// /readyz, /metrics), which need no token even when auth is on.
const (
	ScopeNone Scope = iota
	ScopeRead
	ScopeWrite
	ScopeAdmin
)

// String is the scope's name in a tokens file: "read", "write" or "admin".
func (s Scope) String() string {
	switch s {
	case ScopeNone:
		return "none"
	case ScopeRead:
		return "read"
	case ScopeWrite:
		return "write"
	case ScopeAdmin:
		return "admin"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// ParseScope parses a scope name of a tokens file.
func ParseScope(name string) (Scope, error) {
	switch name {
	case "read":
		return ScopeRead, nil
	case "write":
		return ScopeWrite, nil
	case "admin":
		return ScopeAdmin, nil
	}
	return ScopeNone, fmt.Errorf("unknown scope %q (want read, write or admin)", name)
}

// Tokens is a set of bearer tokens, each stored as its SHA-256 and granted
// a scope. It is safe for concurrent use; Replace swaps the whole set at
// once (a reload of the tokens file), so a request sees either the old
// set or the new one, never a mix.
type Tokens struct {
	set atomic.Pointer[[]tokenEntry]
}

// Replace makes t hold next's tokens from now on. Requests already
// authorized keep what they were granted.
func (t *Tokens) Replace(next *Tokens) {
	t.set.Store(next.set.Load())
}

// Len is the number of tokens in the set.
func (t *Tokens) Len() int {
	return len(t.entries())
}

// entries is the current set.
func (t *Tokens) entries() []tokenEntry { return *t.set.Load() }

type tokenEntry struct {
	name  string
	sum   [sha256.Size]byte
	scope Scope
	// acc restricts the keys and holders the token may use; nil: none
	// (scope.go).
	acc *access
}

// tokensFile is the JSON shape of a tokens file.
type tokensFile struct {
	Tokens []tokenFileEntry `json:"tokens"`
}

// tokenFileEntry is one token of a tokens file.
type tokenFileEntry struct {
	Name   string   `json:"name"`
	SHA256 string   `json:"sha256"`
	Scopes []string `json:"scopes"`
	// Keys and Holders restrict a read or write token (scope.go);
	// absent: no restriction.
	Keys    json.RawMessage `json:"keys,omitempty"`
	Holders json.RawMessage `json:"holders,omitempty"`
}

// LoadTokens reads a tokens file:
//
//	{"tokens": [{"name": "ops", "sha256": "<hex SHA-256 of the token>", "scopes": ["admin"]}]}
//
// Names must be unique and non-empty, each sha256 is 64 hex digits and
// unique, and each token has at least one scope; a token's scope is the
// strongest it lists. The file holds no secret, only hashes (see HashToken).
//
// A read or write token may be scoped to some keys and holders:
//
//	{"name": "tenant-a", "sha256": "...", "scopes": ["write"],
//	 "keys": {"read": ["shared/"], "write": ["tenant-a/"]},
//	 "holders": {"names": ["gateway-a"], "prefixes": ["tenant-a/"]}}
//
// "keys" lists key prefixes it may read and (with the write scope) write;
// writing implies reading; "" matches every key. "holders" lists the holder
// names it may act as, exact or by prefix. Either left out restricts
// nothing. An admin token cannot be restricted. docs/security.md says what each route does
// with a scoped token.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens file: %w", err)
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens parses the contents of a tokens file; see LoadTokens.
func ParseTokens(data []byte) (*Tokens, error) {
	var f tokensFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: data after the tokens object")
	}
	if len(f.Tokens) == 0 {
		return nil, errors.New(`no tokens: "tokens" must list at least one token`)
	}
	entries := make([]tokenEntry, 0, len(f.Tokens))
	names := make(map[string]bool, len(f.Tokens))
	sums := make(map[[sha256.Size]byte]string, len(f.Tokens))
	for i, ft := range f.Tokens {
		if ft.Name == "" {
			return nil, fmt.Errorf("token %d: name is required", i+1)
		}
		if names[ft.Name] {
			return nil, fmt.Errorf("token %q: name used twice", ft.Name)
		}
		names[ft.Name] = true
		raw, err := hex.DecodeString(ft.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("token %q: sha256 must be %d hex digits (the SHA-256 of the token, not the token)", ft.Name, 2*sha256.Size)
		}
		e := tokenEntry{name: ft.Name}
		copy(e.sum[:], raw)
		if other, dup := sums[e.sum]; dup {
			return nil, fmt.Errorf("token %q: same sha256 as token %q", ft.Name, other)
		}
		sums[e.sum] = ft.Name
		if len(ft.Scopes) == 0 {
			return nil, fmt.Errorf("token %q: scopes must list at least one of read, write, admin", ft.Name)
		}
		for _, name := range ft.Scopes {
			sc, err := ParseScope(name)
			if err != nil {
				return nil, fmt.Errorf("token %q: %w", ft.Name, err)
			}
			e.scope = max(e.scope, sc)
		}
		if e.acc, err = parseAccess(e.scope, ft.Keys, ft.Holders); err != nil {
			return nil, fmt.Errorf("token %q: %w", ft.Name, err)
		}
		entries = append(entries, e)
	}
	t := &Tokens{}
	t.set.Store(&entries)
	return t, nil
}

// HashToken returns the hex SHA-256 of a bearer token, as a tokens file
// stores it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// lookup finds the entry of a presented bearer token. It compares against
// every entry in constant time, so the time taken says nothing about which
// entry (if any) matched.
func (t *Tokens) lookup(token string) (tokenEntry, bool) {
	sum := sha256.Sum256([]byte(token))
	entries := t.entries()
	found := -1
	for i := range entries {
		if subtle.ConstantTimeCompare(sum[:], entries[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return tokenEntry{}, false
	}
	return entries[found], true
}

// bearerToken extracts the token of an "Authorization: Bearer <token>"
// header; ok is false when there is none.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// tokenName is the name of r's bearer token ("" when auth is off or the
// token is unknown): who did an admin operation, never the secret.
func (s *core) tokenName(r *http.Request) string {
	if s.tokens == nil {
		return ""
	}
	token, ok := bearerToken(r)
	if !ok {
		return ""
	}
	e, ok := s.tokens.lookup(token)
	if !ok {
		return ""
	}
	return e.name
}

// authorize checks the request's bearer token against need and answers 401
// or 403 itself when it falls short. It reads nothing but the Authorization
// header, so a rejected request has no effect at all. acc is the token's
// restrictions (nil: none).
func (s *core) authorize(w http.ResponseWriter, r *http.Request, need Scope) (acc *access, ok bool) {
	token, ok := bearerToken(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold"`)
		writeErrorBody(w, http.StatusUnauthorized, &wire.Error{Code: wire.CodeUnauthenticated,
			Message: "a bearer token is required (Authorization: Bearer <token>)"})
		return nil, false
	}
	e, ok := s.tokens.lookup(token)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="leasehold", error="invalid_token"`)
		writeErrorBody(w, http.StatusUnauthorized, &wire.Error{Code: wire.CodeUnauthenticated,
			Message: "unknown bearer token"})
		return nil, false
	}
	if e.scope < need {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="leasehold", error="insufficient_scope", scope=%q`, need))
		writeErrorBody(w, http.StatusForbidden, &wire.Error{Code: wire.CodePermissionDenied,
			Message: fmt.Sprintf("token %q has scope %s; this route needs %s", e.name, e.scope, need)})
		return nil, false
	}
	if need == ScopeAdmin {
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "admin request",
			slog.String("method", r.Method), slog.String("route", routeOf(w)),
			slog.String("token_name", e.name))
	}
	return e.acc, true
}

// refuseScoped answers 403 to a scoped token on a route for unrestricted
// tokens only (the control lease's socket: whoever holds it gates the
// cluster's operator actions).
func refuseScoped(w http.ResponseWriter) {
	writeErrorBody(w, http.StatusForbidden, &wire.Error{Code: wire.CodePermissionDenied,
		Message: "this token is restricted to some keys or holders; this route needs a token without restrictions"})
}
