package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/leasehold/leasehold/wire"
)

// access is what a scoped token may touch within its scope: the keys it
// may read and write, and the holder names it may act as. A nil *access,
// and a nil field, restrict nothing (a token without "keys" and
// "holders"). An access is immutable.
type access struct {
	// keys restricts keys by prefix; nil: every key.
	keys *keyAccess
	// holders restricts holder names; nil: every holder.
	holders *holderAccess
}

// keyAccess lists key prefixes. A key is readable when it starts with a
// prefix of read or of write (writing implies reading), writable when it
// starts with a prefix of write. An empty prefix matches every key.
type keyAccess struct {
	read, write []string
}

// holderAccess lists holder names, exact or by prefix.
type holderAccess struct {
	names    []string
	prefixes []string
}

// canRead reports whether a lease on key is visible to the token.
func (a *access) canRead(key string) bool {
	if a == nil || a.keys == nil {
		return true
	}
	return hasAnyPrefix(key, a.keys.write) || hasAnyPrefix(key, a.keys.read)
}

// canWrite reports whether the token may take, renew or release a lease on
// key.
func (a *access) canWrite(key string) bool {
	if a == nil || a.keys == nil {
		return true
	}
	return hasAnyPrefix(key, a.keys.write)
}

// canHold reports whether the token may act as holder: take leases and
// create sessions under that name, see and use its sessions, release all
// of its leases.
func (a *access) canHold(holder string) bool {
	if a == nil || a.holders == nil {
		return true
	}
	return slices.Contains(a.holders.names, holder) || hasAnyPrefix(holder, a.holders.prefixes)
}

// keyScoped and holderScoped report whether the token is restricted to
// some keys, to some holders.
func (a *access) keyScoped() bool    { return a != nil && a.keys != nil }
func (a *access) holderScoped() bool { return a != nil && a.holders != nil }

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// readPrefixes lists every prefix under which keys are readable.
func (k *keyAccess) readPrefixes() []string {
	return append(append([]string(nil), k.write...), k.read...)
}

// The fields of a scoped entry of a tokens file:
//
//	"keys":    {"read": ["prefix", ...], "write": ["prefix", ...]}
//	"holders": {"names": ["name", ...], "prefixes": ["prefix", ...]}
type keysField struct {
	Read  []string `json:"read"`
	Write []string `json:"write"`
}

type holdersField struct {
	Names    []string `json:"names"`
	Prefixes []string `json:"prefixes"`
}

// Bounds of the entries of a scoped token, as of the keys and holders they
// name (fsm.MaxKeyBytes, fsm.MaxHolderBytes).
const (
	maxKeyBytes    = 512
	maxHolderBytes = 128
	// maxScopeItems bounds each list of a token's restrictions.
	maxScopeItems = 1000
)

// parseAccess reads the "keys" and "holders" of a tokens file entry (raw
// JSON, nil when absent) for a token of scope sc. It returns nil when both
// are absent: the token is not restricted.
func parseAccess(sc Scope, rawKeys, rawHolders json.RawMessage) (*access, error) {
	if rawKeys == nil && rawHolders == nil {
		return nil, nil
	}
	if sc == ScopeAdmin {
		return nil, errors.New(`an admin token cannot be restricted by "keys" or "holders" (an admin acts on the whole cluster); give the restricted part its own read or write token`)
	}
	a := &access{}
	if rawKeys != nil {
		var kf keysField
		if err := decodeScopeField(rawKeys, &kf); err != nil {
			return nil, fmt.Errorf(`"keys" must be an object {"read": [prefix, ...], "write": [prefix, ...]}: %w`, err)
		}
		if len(kf.Read)+len(kf.Write) == 0 {
			return nil, errors.New(`"keys" lists no prefix: give "read" or "write" prefixes (an empty prefix "" matches every key), or leave "keys" out for every key`)
		}
		if len(kf.Write) > 0 && sc < ScopeWrite {
			return nil, fmt.Errorf(`"keys.write" needs the write scope; this token has scope %s (list its prefixes in "keys.read")`, sc)
		}
		for _, list := range []struct {
			name  string
			items []string
		}{{"keys.read", kf.Read}, {"keys.write", kf.Write}} {
			if len(list.items) > maxScopeItems {
				return nil, fmt.Errorf("%q lists %d prefixes, at most %d", list.name, len(list.items), maxScopeItems)
			}
			for _, p := range list.items {
				if err := checkScopeString(p, maxKeyBytes, true); err != nil {
					return nil, fmt.Errorf("%s prefix %q: %w", list.name, p, err)
				}
			}
		}
		a.keys = &keyAccess{read: dedupe(kf.Read), write: dedupe(kf.Write)}
	}
	if rawHolders != nil {
		var hf holdersField
		if err := decodeScopeField(rawHolders, &hf); err != nil {
			return nil, fmt.Errorf(`"holders" must be an object {"names": [holder, ...], "prefixes": [prefix, ...]}: %w`, err)
		}
		if len(hf.Names)+len(hf.Prefixes) == 0 {
			return nil, errors.New(`"holders" lists no name or prefix: leave "holders" out for every holder`)
		}
		if len(hf.Names) > maxScopeItems || len(hf.Prefixes) > maxScopeItems {
			return nil, fmt.Errorf(`"holders" lists more than %d names or prefixes`, maxScopeItems)
		}
		for _, n := range hf.Names {
			if err := checkScopeString(n, maxHolderBytes, false); err != nil {
				return nil, fmt.Errorf("holders.names %q: %w", n, err)
			}
		}
		for _, p := range hf.Prefixes {
			if p == "" {
				return nil, errors.New(`holders.prefixes: an empty prefix would match every holder; leave "holders" out instead`)
			}
			if err := checkScopeString(p, maxHolderBytes, false); err != nil {
				return nil, fmt.Errorf("holders.prefixes %q: %w", p, err)
			}
		}
		a.holders = &holderAccess{names: dedupe(hf.Names), prefixes: dedupe(hf.Prefixes)}
	}
	return a, nil
}

// decodeScopeField decodes one JSON object into v: no unknown field, no null,
// nothing after it.
func decodeScopeField(raw json.RawMessage, v any) error {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return errors.New("null")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// checkScopeString checks a key prefix or holder name of a tokens file as
// the node checks keys and holders: valid UTF-8, at most maxBytes, no
// control character; empty only if allowEmpty.
func checkScopeString(s string, maxBytes int, allowEmpty bool) error {
	if s == "" && !allowEmpty {
		return errors.New("must not be empty")
	}
	if len(s) > maxBytes {
		return fmt.Errorf("must be at most %d bytes", maxBytes)
	}
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0) {
			return errors.New("contains a control character")
		}
	}
	return nil
}

func dedupe(s []string) []string {
	if len(s) == 0 {
		return nil // one form for "none": absent, null and [] alike
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// accessKey is the request context key of a scoped token's access.
type accessKey struct{}

// withAccess returns r carrying a (r itself when a is nil: unrestricted).
func withAccess(r *http.Request, a *access) *http.Request {
	if a == nil {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), accessKey{}, a))
}

// accessOf is the access of the request's token; nil when the token is not
// restricted (or auth is off).
func accessOf(r *http.Request) *access {
	a, _ := r.Context().Value(accessKey{}).(*access)
	return a
}

// scopeDenied is the 403 of a request its token's restrictions do not
// allow, decided from what the request itself names (a key, a holder), or
// about an object the token can already see: it says nothing the caller
// does not know.
func scopeDenied(format string, args ...any) *wire.Error {
	return &wire.Error{Code: wire.CodePermissionDenied, Message: fmt.Sprintf(format, args...)}
}

// accessView is a token's restrictions as GET /v1/whoami shows them.
type accessView struct {
	Keys    *keysField    `json:"keys,omitempty"`
	Holders *holdersField `json:"holders,omitempty"`
}

func (a *access) view() *accessView {
	if a == nil {
		return nil
	}
	v := &accessView{}
	if a.keys != nil {
		v.Keys = &keysField{Read: nonNil(a.keys.read), Write: nonNil(a.keys.write)}
	}
	if a.holders != nil {
		v.Holders = &holdersField{Names: nonNil(a.holders.names), Prefixes: nonNil(a.holders.prefixes)}
	}
	return v
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
