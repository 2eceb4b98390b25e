package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/leasehold/leasehold/api"
)

// tokenEntry is one entry of a tokens file's "tokens" list (see
// api.LoadTokens).
type tokenEntry struct {
	Name   string   `json:"name"`
	SHA256 string   `json:"sha256"`
	Scopes []string `json:"scopes"`
}

func (a *app) tokenCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(a.stdout, "usage: leasehold token create --name NAME --scopes read,write,admin")
			return nil
		}
		return usageErrorf("usage: leasehold token create --name NAME --scopes read,write,admin")
	}
	fs := a.newFlagSet("token create", "", "Create a bearer token. Prints the token (give it to the client; it is not stored\n"+
		"anywhere) and the entry to add to the server's tokens file, which holds only its SHA-256:\n"+
		`  {"tokens": [ENTRY, ...]}`)
	name := fs.String("name", "", "name of the token (unique in the tokens file)")
	scopes := fs.String("scopes", "read,write", "comma-separated scopes: read, write, admin")
	asJSON := fs.Bool("json", false, "print one JSON object with token and entry")
	pos, err := a.parse(fs, args[1:], nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("token create takes no arguments")
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
	token := newBearerToken()
	e.SHA256 = api.HashToken(token)
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

// newBearerToken returns 32 bytes from the CSPRNG, base64url without
// padding.
func newBearerToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}
