package api

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/julienschmidt/httprouter"
)

// uiFiles is the web console: plain HTML, CSS and JavaScript, no build step.
//
//go:embed ui
var uiFiles embed.FS

// uiPrefix is where the console is served.
const uiPrefix = "/ui/"

// uiCSP keeps the console to its own files and this server's API: no inline
// script, no third-party origin, no framing.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiFileServer serves the console's embedded files under uiPrefix.
var uiFileServer = func() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	return http.StripPrefix(uiPrefix[:len(uiPrefix)-1], http.FileServerFS(sub))
}()

// consoleRedirect handles GET / and GET /ui: the console's entry point.
func consoleRedirect(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	http.Redirect(w, r, uiPrefix, http.StatusFound)
	return nil
}

// consoleFile handles GET /ui/*file: the console's files (index.html,
// app.js, style.css), kept to themselves by uiCSP.
func consoleFile(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	h := w.Header()
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	uiFileServer.ServeHTTP(w, r)
	return nil
}

// whoamiAnswer is the answer of GET /v1/whoami. It never holds the token.
type whoamiAnswer struct {
	// Auth is false when the server has auth off (anyone may do anything).
	Auth bool `json:"auth"`
	// Name is the token's name in the tokens file.
	Name  string `json:"name,omitempty"`
	Scope string `json:"scope"`
	// Restricted: the token may use only the keys and holders of
	// Keys and Holders (each absent: every key, every holder).
	Restricted bool          `json:"restricted,omitempty"`
	Keys       *keysField    `json:"keys,omitempty"`
	Holders    *holdersField `json:"holders,omitempty"`
}

// whoami handles GET /v1/whoami: the name, scope and restrictions of the
// request's bearer token (auth already checked that it is a known token).
func (s *infoAPI) whoami(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	a := whoamiAnswer{Scope: ScopeAdmin.String()}
	if s.tokens != nil {
		tok, _ := bearerToken(r)
		e, _ := s.tokens.lookup(tok)
		a = whoamiAnswer{Auth: true, Name: e.name, Scope: e.scope.String()}
		if v := e.acc.view(); v != nil {
			a.Restricted, a.Keys, a.Holders = true, v.Keys, v.Holders
		}
	}
	writeJSON(w, http.StatusOK, a)
	return nil
}
