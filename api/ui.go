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

// uiRoutes serve the console's static files. They need no token even when
// auth is on (the files hold no data; the console sends the user's bearer
// token on every API call it makes), and a follower serves them itself.
func (s *server) uiRoutes() []route {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.StripPrefix(uiPrefix[:len(uiPrefix)-1], http.FileServerFS(sub))
	redirect := func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
		http.Redirect(w, r, uiPrefix, http.StatusFound)
		return nil
	}
	return []route{
		// The console's entry point.
		{"GET", "/", need(ScopeNone), redirect},
		{"GET", "/ui", need(ScopeNone), redirect},
		// The console's files (index.html, app.js, style.css).
		{"GET", uiPrefix + "*file", need(ScopeNone), func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
			h := w.Header()
			h.Set("Content-Security-Policy", uiCSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			files.ServeHTTP(w, r)
			return nil
		}},
		// Who the presented bearer token is, for the console to offer the
		// actions its scope allows. Without auth: scope admin.
		{"GET", "/v1/whoami", need(ScopeRead), s.whoami},
	}
}

// whoamiAnswer is the answer of GET /v1/whoami. It never holds the token.
type whoamiAnswer struct {
	// Auth is false when the server has auth off (anyone may do anything).
	Auth bool `json:"auth"`
	// Name is the token's name in the tokens file.
	Name  string `json:"name,omitempty"`
	Scope string `json:"scope"`
}

// whoami handles GET /v1/whoami: the name and scope of the request's bearer
// token (auth already checked that it is a known token).
func (s *server) whoami(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	a := whoamiAnswer{Scope: ScopeAdmin.String()}
	if s.tokens != nil {
		tok, _ := bearerToken(r)
		e, _ := s.tokens.lookup(tok)
		a = whoamiAnswer{Auth: true, Name: e.name, Scope: e.scope.String()}
	}
	writeJSON(w, http.StatusOK, a)
	return nil
}
