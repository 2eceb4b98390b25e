package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/api"
)

// tokenEntry is one entry of a tokens file's "tokens" list (see
// api.LoadTokens).
type tokenEntry struct {
	Name    string        `json:"name"`
	SHA256  string        `json:"sha256"`
	Scopes  []string      `json:"scopes"`
	Keys    *tokenKeys    `json:"keys,omitempty"`
	Holders *tokenHolders `json:"holders,omitempty"`
}

// tokenKeys and tokenHolders restrict a scoped token (api.LoadTokens).
type tokenKeys struct {
	Read  []string `json:"read,omitempty"`
	Write []string `json:"write,omitempty"`
}

type tokenHolders struct {
	Names    []string `json:"names,omitempty"`
	Prefixes []string `json:"prefixes,omitempty"`
}

// listFlag collects the values of a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

const tokenUsage = "usage: leasehold token create --name NAME --scopes read,write,admin\n" +
	"       [--read-prefix P]... [--write-prefix P]... [--holder NAME]... [--holder-prefix P]..."

func (a *app) tokenCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(a.stdout, tokenUsage)
			return nil
		}
		return usageErrorf("%s", tokenUsage)
	}
	fs := a.newFlagSet("token create", "", "Create a bearer token. Prints the token (give it to the client; it is not stored\n"+
		"anywhere) and the entry to add to the server's tokens file, which holds only its SHA-256:\n"+
		`  {"tokens": [ENTRY, ...]}`+"\n"+
		"A read or write token may be scoped to some keys and holders (docs/security.md): without\n"+
		"any of the prefix and holder flags it may use every key and holder.")
	name := fs.String("name", "", "name of the token (unique in the tokens file)")
	scopes := fs.String("scopes", "read,write", "comma-separated scopes: read, write, admin")
	var readPrefixes, writePrefixes, holders, holderPrefixes listFlag
	fs.Var(&readPrefixes, "read-prefix", "the token may read keys with this prefix (repeatable; '' is every key)")
	fs.Var(&writePrefixes, "write-prefix", "the token may read and write keys with this prefix (repeatable; needs the write scope)")
	fs.Var(&holders, "holder", "the token may act as this holder (repeatable)")
	fs.Var(&holderPrefixes, "holder-prefix", "the token may act as holders with this prefix (repeatable)")
	asJSON := fs.Bool("json", false, "print one JSON object with token and entry")
	if err := a.parseNone(fs, args[1:], nil, ""); err != nil {
		return err
	}
	if *name == "" {
		return usageErrorf("token create needs --name")
	}
	e := tokenEntry{Name: *name, Scopes: splitList(*scopes)}
	if len(e.Scopes) == 0 {
		return usageErrorf("--scopes must list at least one of read, write, admin")
	}
	for _, s := range e.Scopes {
		if _, err := api.ParseScope(s); err != nil {
			return usageErrorf("--scopes: %v", err)
		}
	}
	if len(readPrefixes)+len(writePrefixes) > 0 {
		e.Keys = &tokenKeys{Read: readPrefixes, Write: writePrefixes}
	}
	if len(holders)+len(holderPrefixes) > 0 {
		e.Holders = &tokenHolders{Names: holders, Prefixes: holderPrefixes}
	}
	token := newBearerToken()
	e.SHA256 = api.HashToken(token)
	// The server's own check of the entry, before the token is shown.
	entry, err := json.Marshal(tokensFileOf(e))
	if err != nil {
		return err
	}
	if _, err := api.ParseTokens(entry); err != nil {
		return usageErrorf("%v", strings.TrimPrefix(err.Error(), fmt.Sprintf("token %q: ", e.Name)))
	}
	if *asJSON {
		return writeJSON(a.stdout, struct {
			Token string     `json:"token"`
			Entry tokenEntry `json:"entry"`
		}{token, e})
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "token: %s\n(shown once; clients send it as --token or LEASEHOLD_TOKEN)\n\n"+
		"tokens file entry (inside {\"tokens\": [...]}):\n%s\n", token, line)
	return err
}

// tokensFileOf is a tokens file holding e alone.
func tokensFileOf(e tokenEntry) any {
	return struct {
		Tokens []tokenEntry `json:"tokens"`
	}{[]tokenEntry{e}}
}

// newBearerToken returns 32 bytes from the CSPRNG, base64url without
// padding.
func newBearerToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}
