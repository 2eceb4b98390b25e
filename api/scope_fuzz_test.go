package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// Fuzz targets over token scopes: the tokens file's scoped entries and the
// decisions made from them (FuzzTokenScopes), and the answers of a real
// node to a token of fuzzed scope (FuzzScopedAnswers).

// fuzzLines splits a fuzzed list: "" is no list at all (the field is left
// out of the tokens file), otherwise one item a line ("\n" alone: one
// empty item). Each byte that is not UTF-8 becomes U+FFFD, as JSON
// writes it into the tokens file (FuzzParseTokens feeds the parser raw
// bytes).
func fuzzLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(string([]rune(s)), "\n")
}

// scopedEntry writes a tokens file of one token of scope with the given
// restrictions (nil lists: the field left out).
func scopedEntry(scope string, read, write, names, prefixes []string) []byte {
	e := map[string]any{"name": "t", "sha256": HashToken("t"), "scopes": []string{scope}}
	if read != nil || write != nil {
		e["keys"] = map[string][]string{"read": nonNil(read), "write": nonNil(write)}
	}
	if names != nil || prefixes != nil {
		e["holders"] = map[string][]string{"names": nonNil(names), "prefixes": nonNil(prefixes)}
	}
	b, _ := json.Marshal(map[string]any{"tokens": []any{e}})
	return b
}

// modelValid is what a key prefix or holder name of a tokens file must be,
// written apart from the parser.
func modelValid(s string, maxBytes int) bool {
	if len(s) > maxBytes || !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0) })
}

func anyPrefix(s string, ps []string) bool {
	return slices.ContainsFunc(ps, func(p string) bool { return strings.HasPrefix(s, p) })
}

// FuzzTokenScopes: a scoped entry parses exactly when a model of the rules
// says it should; the parsed token decides every key and holder as the
// model does (writing implies reading; an absent list restricts nothing);
// a listing narrowed for it selects exactly the readable leases the
// request selects; and hidden ids never are real ones.
func FuzzTokenScopes(f *testing.F) {
	f.Add(uint8(1), "shared/", "t/", "w1", "t-", "t/1\nshared/x\nu/2\nt", "t-9", "t")
	f.Add(uint8(1), "", "a/\nb/", "", "", "a/1\nb/2\nc/3", "x", "")
	f.Add(uint8(0), "\n", "", "w", "", "any\n", "w", "an")
	f.Add(uint8(2), "x", "", "", "", "x", "h", "")
	f.Add(uint8(1), "", "", "", "\n", "k", "h", "k")
	f.Add(uint8(1), "a/\u0007", "", "", "", "a/", "h", "")
	f.Fuzz(func(t *testing.T, sc uint8, read, write, names, prefixes, keys, holder, listPrefix string) {
		scope := []string{"read", "write", "admin"}[sc%3]
		r, w, hn, hp := fuzzLines(read), fuzzLines(write), fuzzLines(names), fuzzLines(prefixes)
		keysOn, holdersOn := r != nil || w != nil, hn != nil || hp != nil
		valid := true
		switch {
		case scope == "admin" && (keysOn || holdersOn):
			valid = false
		case scope == "read" && len(w) > 0:
			valid = false
		case len(r) > maxScopeItems || len(w) > maxScopeItems || len(hn) > maxScopeItems || len(hp) > maxScopeItems:
			valid = false
		}
		for _, p := range append(append([]string{}, r...), w...) {
			valid = valid && modelValid(p, 512)
		}
		for _, h := range append(append([]string{}, hn...), hp...) {
			valid = valid && h != "" && modelValid(h, 128)
		}
		tk, err := ParseTokens(scopedEntry(scope, r, w, hn, hp))
		if (err == nil) != valid {
			t.Fatalf("scope %s keys %q %q holders %q %q: err %v, model says valid=%v", scope, r, w, hn, hp, err, valid)
		}
		if err != nil {
			return
		}
		a := tk.entries()[0].acc
		if (a != nil) != (keysOn || holdersOn) {
			t.Fatalf("restricted = %v for keys %v holders %v", a != nil, keysOn, holdersOn)
		}
		ks := fuzzLines(keys)
		for _, k := range ks {
			canR := !keysOn || anyPrefix(k, r) || anyPrefix(k, w)
			canW := !keysOn || anyPrefix(k, w)
			if a.canRead(k) != canR || a.canWrite(k) != canW {
				t.Fatalf("key %q: read %v write %v, model %v %v", k, a.canRead(k), a.canWrite(k), canR, canW)
			}
		}
		canH := !holdersOn || slices.Contains(hn, holder) || anyPrefix(holder, hp)
		if a.canHold(holder) != canH {
			t.Fatalf("holder %q: %v, model %v", holder, a.canHold(holder), canH)
		}

		// A listing narrowed for the token selects exactly the readable
		// leases the request selects.
		for _, req := range []wire.ListRequest{{Prefix: listPrefix}, {Key: listPrefix}} {
			nr, some := a.narrowLeases(req)
			for _, k := range ks {
				want := (req.Key == "" || k == req.Key) && strings.HasPrefix(k, req.Prefix) && a.canRead(k)
				got := some && (nr.Key == "" || k == nr.Key) && strings.HasPrefix(k, nr.Prefix) && a.canRead(k)
				if want != got {
					t.Fatalf("listing %+v narrowed to %+v (%v): key %q selected %v, want %v", req, nr, some, k, got, want)
				}
			}
		}
		if h, ok := a.narrowSessions(holder); ok != a.canHold(holder) || (ok && holder != "" && h != holder) {
			t.Fatalf("narrowSessions(%q) = %q, %v", holder, h, ok)
		}

		id := "ls_" + fmt.Sprintf("%x", []byte(keys))
		if len(id) > 3 {
			h := hiddenID(id)
			if h == id || len(h) != len(id) || strings.ContainsAny(h[3:], "0123456789abcdef") {
				t.Fatalf("hiddenID(%q) = %q", id, h)
			}
		}
	})
}

// serve sends one request to h (as do, without a test to fail).
func serve(h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// FuzzScopedAnswers drives a real node's API with one token of fuzzed
// scope, keys and holders, and one operation on one of a fixed set of
// leases and sessions (with wrong lease and session tokens: nothing
// changes): an answer about an object the token may not see is the answer
// about a missing one but for the id, and names no object it may not see;
// listings show only what it may see.
func FuzzScopedAnswers(f *testing.F) {
	if testing.Short() {
		f.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.Close() })
	open := New(FromNode(n), Options{}) // auth off: sets the scene
	pollUntil(f, 10*time.Second, "the node to be ready", func() bool { return serve(open, "GET", "/readyz", "").Code == 200 })
	var leases []wire.Lease
	var sessions []wire.Session
	acquire := func(body string, hdr ...string) wire.Lease {
		rec := serve(open, "POST", "/v1/leases", body, hdr...)
		var l wire.Lease
		if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
			f.Fatalf("acquire %s: %d %s", body, rec.Code, rec.Body)
		}
		leases = append(leases, l)
		return l
	}
	for _, kh := range [][2]string{{"t1/a", "h1"}, {"t2/b", "h2"}, {"t1/sub/c", "h1-x"}, {"shared/x", "h2"}} {
		acquire(`{"key":"` + kh[0] + `","holder":"` + kh[1] + `","ttl_ms":3600000}`)
	}
	for _, h := range []string{"h1", "h2"} {
		rec := serve(open, "POST", "/v1/sessions", `{"holder":"`+h+`","ttl_ms":3600000}`)
		var ss wire.Session
		if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &ss) != nil {
			f.Fatalf("session: %d %s", rec.Code, rec.Body)
		}
		sessions = append(sessions, ss)
	}
	acquire(`{"key":"t2/s","session_id":"`+sessions[0].SessionID+`"}`, "X-Session-Token", sessions[0].Token)
	ended := acquire(`{"key":"t1/e","holder":"h1","ttl_ms":3600000}`)
	if rec := serve(open, "DELETE", "/v1/leases/"+ended.LeaseID, "", "X-Lease-Token", ended.Token); rec.Code != 200 {
		f.Fatalf("release: %d %s", rec.Code, rec.Body)
	}

	f.Add(uint8(1), "t1/", "", "h1", "", uint8(0), uint8(1), "")
	f.Add(uint8(1), "", "t2/", "", "h2", uint8(2), uint8(0), "t")
	f.Add(uint8(0), "shared/\nt1/sub/", "", "", "h1-", uint8(7), uint8(0), "")
	f.Add(uint8(1), "", "t1/", "", "h1", uint8(10), uint8(1), "t1/")
	f.Add(uint8(1), "", "x/", "", "", uint8(12), uint8(0), "")
	f.Add(uint8(1), "t", "", "h", "", uint8(11), uint8(0), "t")
	f.Fuzz(func(t *testing.T, sc uint8, read, write, names, prefixes string, op, which uint8, listPrefix string) {
		scope := []string{"read", "write"}[sc%2]
		tk, err := ParseTokens(scopedEntry(scope, fuzzLines(read), fuzzLines(write), fuzzLines(names), fuzzLines(prefixes)))
		if err != nil || tk.entries()[0].acc == nil {
			return
		}
		a := tk.entries()[0].acc
		h := New(FromNode(n), Options{Tokens: tk})
		auth := []string{"Authorization", "Bearer t"}
		var hiddenIDs []string
		for _, l := range leases {
			if !a.canRead(l.Key) {
				hiddenIDs = append(hiddenIDs, l.LeaseID)
			}
		}
		for _, ss := range sessions {
			if !a.canHold(ss.Holder) {
				hiddenIDs = append(hiddenIDs, ss.SessionID)
			}
		}
		l := leases[int(which)%len(leases)]
		ss := sessions[int(which)%len(sessions)]
		writeKey := "zz/k"
		if w := fuzzLines(write); len(w) > 0 {
			writeKey = w[0] + "k"
		}
		type opCase struct {
			method, path, body string
			hdr                []string
			id                 string
			hidden             bool
		}
		lh, sh := !a.canRead(l.Key), !a.canHold(ss.Holder)
		ops := []opCase{
			{"GET", "/v1/leases/{id}", "", nil, l.LeaseID, lh},
			{"GET", "/v1/leases/{id}?stale=true", "", nil, l.LeaseID, lh},
			{"POST", "/v1/leases/{id}/renew", "", []string{"X-Lease-Token", "wrong"}, l.LeaseID, lh},
			{"DELETE", "/v1/leases/{id}", "", []string{"X-Lease-Token", "wrong"}, l.LeaseID, lh},
			{"POST", "/v1/validate", `{"lease_id":"{id}","token":"wrong"}`, nil, l.LeaseID, lh},
			{"POST", "/v1/heartbeat", `{"leases":[{"lease_id":"{id}","token":"wrong"}]}`, nil, l.LeaseID, lh},
			{"POST", "/v1/validate", `{"lease_id":"{id}","token":"` + l.Token + `"}`, nil, l.LeaseID, lh},
			{"GET", "/v1/sessions/{id}", "", nil, ss.SessionID, sh},
			{"POST", "/v1/sessions/{id}/heartbeat", "", []string{"X-Session-Token", "wrong"}, ss.SessionID, sh},
			{"DELETE", "/v1/sessions/{id}", "", []string{"X-Session-Token", "wrong"}, ss.SessionID, sh},
			{"POST", "/v1/leases", `{"key":` + strconvQuote(writeKey) + `,"session_id":"{id}"}`, []string{"X-Session-Token", "wrong"}, ss.SessionID, sh},
			{"GET", "/v1/leases?prefix=" + url.QueryEscape(listPrefix), "", nil, "", false},
			{"GET", "/v1/sessions", "", nil, "", false},
		}
		c := ops[int(op)%len(ops)]
		send := func(id string) *httptest.ResponseRecorder {
			return serve(h, c.method, strings.ReplaceAll(c.path, "{id}", id), strings.ReplaceAll(c.body, "{id}", id), append(append([]string{}, auth...), c.hdr...)...)
		}
		got := send(c.id)
		body := got.Body.String()
		if c.hidden {
			mid := missingLike(c.id)
			want := send(mid)
			if got.Code != want.Code || strings.ReplaceAll(body, c.id, mid) != want.Body.String() {
				t.Fatalf("%s %s: an object the token may not see is answered\n %d %s\nand a missing one\n %d %s",
					c.method, c.path, got.Code, body, want.Code, want.Body)
			}
			body = strings.ReplaceAll(body, c.id, mid)
		}
		for _, id := range hiddenIDs {
			if strings.Contains(body, id) {
				t.Fatalf("%s %s: the answer names %s, which the token may not see: %s", c.method, c.path, id, body)
			}
		}
		if c.path == "/v1/sessions" && got.Code == 200 {
			var list wire.SessionList
			_ = json.Unmarshal(got.Body.Bytes(), &list)
			for _, s := range list.Sessions {
				if !a.canHold(s.Holder) {
					t.Fatalf("listed session of %q", s.Holder)
				}
			}
		}
		if strings.HasPrefix(c.path, "/v1/leases?") && got.Code == 200 {
			var list wire.LeaseList
			_ = json.Unmarshal(got.Body.Bytes(), &list)
			for _, l := range list.Leases {
				if !a.canRead(l.Key) {
					t.Fatalf("listed lease on %q", l.Key)
				}
			}
		}
		if got.Code == 200 || got.Code == 201 {
			if c.method != "GET" && !strings.Contains(c.path, "validate") && !strings.Contains(c.path, "heartbeat") {
				t.Fatalf("%s %s with a wrong token succeeded: %s", c.method, c.path, body)
			}
		}
	})
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
