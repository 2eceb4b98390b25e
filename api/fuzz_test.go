package api

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// The fuzz targets of the HTTP layer: every decoder of outside input. Each
// asserts the contract, not only the absence of a panic.

// knownCodes are the contract's error codes an answer may carry.
var knownCodes = map[wire.Code]bool{}

func init() {
	for _, c := range []wire.Code{wire.CodeInvalidArgument, wire.CodeUnauthenticated, wire.CodePermissionDenied,
		wire.CodeLeaseTokenInvalid, wire.CodeLeaseNotFound, wire.CodeSessionNotFound, wire.CodeLeaseHeld,
		wire.CodeLimitMismatch, wire.CodeLockDelay, wire.CodeLeaseExpired, wire.CodeLeaseReleased,
		wire.CodeLeaseRevoked, wire.CodeSessionEnded, wire.CodeIdempotencyConflict, wire.CodePayloadTooLarge,
		wire.CodeResourceExhausted, wire.CodeLeaseRequired, wire.CodeControlLocked, wire.CodeNoLeader,
		wire.CodeIndeterminate, wire.CodeEventsCompacted, wire.CodeUnavailable, wire.CodeNotFound,
		wire.CodeMethodNotAllowed} {
		knownCodes[c] = true
	}
}

// routeSeeds are valid requests, one or more per route with a body or
// parameters: route (method and path pattern), path parameter, query, body.
var routeSeeds = []struct{ method, path, param, query, body string }{
	{"POST", "/v1/leases", "", "", `{"key":"camera/7","holder":"runner-a","ttl_ms":10000,"limit":2,"metadata":{"a":"b"},"idempotency_key":"i","wait_ms":100,"lock_delay_ms":1000}`},
	{"POST", "/v1/leases", "", "", `{"key":"k","session_id":"ss_1"}`},
	{"GET", "/v1/leases", "", "key=k&prefix=p&holder=h&session_id=s&state=active&limit=10&after=ls_1&stale=true", ""},
	{"GET", "/v1/leases/:id", "ls_1", "stale", ""},
	{"POST", "/v1/leases/:id/renew", "ls_1", "", `{"ttl_ms":5000}`},
	{"DELETE", "/v1/leases/:id", "ls_1", "reason=done", `{"reason":"done"}`},
	{"POST", "/v1/leases/:id/revoke", "ls_1", "", `{"reason":"op"}`},
	{"POST", "/v1/heartbeat", "", "", `{"leases":[{"lease_id":"ls_1","token":"t"},{"lease_id":"ls_2","token":"u"}]}`},
	{"POST", "/v1/groups", "", "", `{"keys":[{"key":"dedup/s1"},{"key":"tuners","limit":4}],"holder":"w","ttl_ms":10000,"idempotency_key":"i","wait_ms":100}`},
	{"GET", "/v1/groups/:id", "lg_1", "stale=true", ""},
	{"POST", "/v1/groups/:id/renew", "lg_1", "", `{"ttl_ms":5000}`},
	{"DELETE", "/v1/groups/:id", "lg_1", "reason=done", ""},
	{"POST", "/v1/sessions", "", "", `{"holder":"h","ttl_ms":10000,"metadata":{"x":"y"}}`},
	{"GET", "/v1/sessions", "", "holder=h&limit=5&after=ss_1", ""},
	{"GET", "/v1/sessions/:id", "ss_1", "stale=false", ""},
	{"POST", "/v1/sessions/:id/heartbeat", "ss_1", "", ""},
	{"DELETE", "/v1/sessions/:id", "ss_1", "", ""},
	{"POST", "/v1/holders/:holder/release", "a/b c", "", `{"reason":"restart"}`},
	{"POST", "/v1/keepalive", "", "", "{\"id\":1,\"lease_id\":\"ls_1\",\"token\":\"t\",\"ttl_ms\":5000}\n{\"id\":2,\"lease_id\":\"ls_2\",\"token\":\"u\"}\nnot json\n"},
	{"POST", "/v1/validate", "", "", `{"key":"k","fencing_token":12}`},
	{"POST", "/v1/validate", "", "", `{"lease_id":"ls_1","token":"t"}`},
	{"GET", "/v1/events", "", "prefix=camera/&from=start&after_index=3", ""},
	{"GET", "/v1/cluster", "", "stale=true", ""},
	{"DELETE", "/v1/cluster/members/:id", "n2", "", ""},
	{"POST", "/v1/cluster/transfer-leadership", "", "", `{"id":"n2"}`},
}

// fuzzRequest builds the request a fuzz input describes, or nil when the
// input is not one an HTTP server would pass to a handler.
func fuzzRequest(method, path, param, query string, body []byte, header string) *http.Request {
	target := strings.NewReplacer(":id", url.PathEscape(param), ":holder", url.PathEscape(param)).Replace(path)
	u, err := url.Parse("http://leasehold" + target)
	if err != nil {
		return nil
	}
	u.RawQuery = query
	req, err := http.NewRequestWithContext(context.Background(), method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil
	}
	if len(body) == 0 {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	if header != "" && !strings.ContainsAny(header, "\r\n\x00") {
		req.Header.Set(headerLeaseToken, header)
		req.Header.Set(headerSessionToken, header)
		req.Header.Set("Last-Event-ID", header)
	}
	return req
}

// FuzzRoutes drives the real router with arbitrary path parameters, query
// strings, bodies and token headers on every route, against a fake node
// that accepts everything. Invariants: nothing panics (a panic is a 500);
// every answer carries X-Leasehold-Index and is JSON (or the event stream,
// or the metrics);
// every error answer is exactly one contract error body whose code maps to
// the status sent; a refused request (4xx) never reached the node.
func FuzzRoutes(f *testing.F) {
	routes := New(newFake(), Options{}).(*server).routes()
	index := func(method, path string) uint8 {
		for i, rt := range routes {
			if rt.method == method && rt.path == path {
				return uint8(i)
			}
		}
		f.Fatalf("no route %s %s", method, path)
		return 0
	}
	for _, s := range routeSeeds {
		f.Add(index(s.method, s.path), s.param, s.query, []byte(s.body), "token")
	}
	f.Add(index("POST", "/v1/leases"), "", "", []byte(`{"key":"k","ttl_ms":"5s"}`), "")
	f.Add(index("POST", "/v1/heartbeat"), "", "", []byte(`{"leases":[{"lease_id":1}]}`), "")
	f.Add(index("GET", "/v1/leases"), "", "limit=-1&key=%zz", []byte{}, "")
	f.Add(index("GET", "/v1/events"), "", "", []byte{}, "12-3")
	f.Fuzz(func(t *testing.T, ri uint8, param, query string, body []byte, header string) {
		rt := routes[int(ri)%len(routes)]
		if rt.method == "GET" && rt.path == "/v1/cluster/snapshot" || rt.method == "PUT" && rt.path == "/v1/cluster/snapshot" {
			return // FuzzSnapshotFile (node) covers the snapshot file reader
		}
		req := fuzzRequest(rt.method, rt.path, param, query, body, header)
		if req == nil {
			return
		}
		if rt.path == "/v1/events" {
			// A stream runs until its client goes: this one is gone as
			// soon as the stream has started.
			ctx, cancel := context.WithCancel(req.Context())
			cancel()
			req = req.WithContext(ctx)
		}
		fake := newFake()
		rec := httptest.NewRecorder()
		New(fake, Options{MaxBodyBytes: 4 << 10}).ServeHTTP(rec, req)
		checkAnswer(t, rec, rt.method+" "+rt.path)
		if rec.Code >= 400 && len(fake.called()) != 0 {
			t.Fatalf("%s %s: answered %d %s after calling the node: %v", rt.method, rt.path, rec.Code, rec.Body, fake.called())
		}
	})
}

// checkAnswer asserts what every answer of the API must be.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, what string) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("%s: status %d %s", what, rec.Code, rec.Body)
	}
	if rec.Header().Get(headerIndex) == "" {
		t.Fatalf("%s: answer %d without %s", what, rec.Code, headerIndex)
	}
	ct := rec.Header().Get("Content-Type")
	if rec.Code < 400 && (ct == "text/event-stream" || strings.HasPrefix(ct, "text/plain")) {
		return // an event stream, the metrics
	}
	if rec.Code < 400 && ct == "application/x-ndjson" {
		// A keep-alive stream: one JSON object per line.
		for i, line := range bytes.Split(bytes.TrimSuffix(rec.Body.Bytes(), []byte("\n")), []byte("\n")) {
			if len(line) > 0 && !json.Valid(line) {
				t.Fatalf("%s: line %d of the stream is not JSON: %q", what, i+1, line)
			}
		}
		return
	}
	if ct != "application/json" {
		t.Fatalf("%s: answer %d of type %q", what, rec.Code, ct)
	}
	if rec.Code < 400 {
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s: answer %d is not JSON: %q", what, rec.Code, rec.Body)
		}
		return
	}
	var body struct {
		Error *wire.Error `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Error == nil || dec.More() {
		t.Fatalf("%s: status %d without one error body (%v): %q", what, rec.Code, err, rec.Body)
	}
	e := body.Error
	if !knownCodes[e.Code] || statusFor(e.Code) != rec.Code || e.Message == "" {
		t.Fatalf("%s: status %d with error %+v", what, rec.Code, e)
	}
}

// bodyTypes are the request body types of the API, each with a valid seed.
var bodyTypes = []struct {
	seed string
	new  func() any
}{
	{`{"key":"k","holder":"h","ttl_ms":1000,"session_id":"s","limit":3,"metadata":{"a":"b","":""},"idempotency_key":"i","wait_ms":5,"lock_delay_ms":6}`, func() any { return new(acquireBody) }},
	{`{"ttl_ms":5000}`, func() any { return new(renewBody) }},
	{`{"reason":"done \u00e9"}`, func() any { return new(reasonBody) }},
	{`{"leases":[{"lease_id":"a","token":"b"}]}`, func() any { return new(heartbeatBody) }},
	{`{"key":"k","fencing_token":18446744073709551615,"lease_id":"l","token":"t"}`, func() any { return new(validateBody) }},
	{`{"holder":"h","ttl_ms":1,"metadata":null}`, func() any { return new(sessionBody) }},
	{`{"id":"n1"}`, func() any { return new(transferBody) }},
}

// decodeVia runs decodeBody on body as a request would.
func decodeVia(s *server, body []byte, v any, optional bool) error {
	req := httptest.NewRequest("POST", "/", bytes.NewReader(body))
	return s.decodeBody(httptest.NewRecorder(), req, v, optional)
}

// FuzzDecodeBody: decodeBody, on every request body type, either accepts
// (and then what it decoded encodes and decodes again to the same value)
// or refuses with a contract error: INVALID_ARGUMENT, or PAYLOAD_TOO_LARGE
// exactly when the body is over the limit. An empty optional body is
// errNoBody.
func FuzzDecodeBody(f *testing.F) {
	for i, bt := range bodyTypes {
		f.Add(uint8(i), []byte(bt.seed), false)
	}
	f.Add(uint8(0), []byte(`{"key":"k"} {}`), false)
	f.Add(uint8(3), []byte(`{"leases":[{"lease_id":"a","tok":"b"}]}`), true)
	f.Add(uint8(4), []byte(`{"fencing_token":-1}`), false)
	f.Add(uint8(1), []byte(``), true)
	s := New(newFake(), Options{MaxBodyBytes: 1 << 10}).(*server)
	f.Fuzz(func(t *testing.T, ti uint8, body []byte, optional bool) {
		bt := bodyTypes[int(ti)%len(bodyTypes)]
		v := bt.new()
		err := decodeVia(s, body, v, optional)
		if err != nil {
			if errors.Is(err, errNoBody) {
				if !optional || len(bytes.TrimSpace(body)) != 0 {
					t.Fatalf("errNoBody for %q (optional %v)", body, optional)
				}
				return
			}
			var e *wire.Error
			if !errors.As(err, &e) || e.Message == "" {
				t.Fatalf("not a contract error: %#v", err)
			}
			switch e.Code {
			case wire.CodePayloadTooLarge:
				if int64(len(body)) <= s.maxBody {
					t.Fatalf("%d bytes refused as too large: %v", len(body), e)
				}
			case wire.CodeInvalidArgument:
			default:
				t.Fatalf("code %s for %q", e.Code, body)
			}
			return
		}
		if int64(len(body)) > s.maxBody {
			t.Fatalf("%d bytes accepted over a limit of %d", len(body), s.maxBody)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("decoded %#v does not encode: %v", v, err)
		}
		v2 := bt.new()
		if err := decodeVia(s, again, v2, false); err != nil {
			t.Fatalf("%q re-encoded as %q does not decode: %v", body, again, err)
		}
		if !reflect.DeepEqual(v, v2) {
			t.Fatalf("round trip of %q:\n got %#v\nwant %#v", body, v2, v)
		}
	})
}

// FuzzQuery: the query parser of reads never panics, reports a malformed
// or out-of-range value as INVALID_ARGUMENT naming the parameter, and
// parses what strconv would.
func FuzzQuery(f *testing.F) {
	f.Add("stale=true&limit=10")
	f.Add("stale&limit=1000000000000")
	f.Add("limit=-1")
	f.Add("stale=maybe")
	f.Add("key=%zz")
	f.Add("limit=9223372036854775808")
	f.Fuzz(func(t *testing.T, raw string) {
		req := &http.Request{URL: &url.URL{RawQuery: raw}}
		q := newQuery(req)
		stale, limit := q.stale(), q.limit()
		err := q.check()
		if err != nil {
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != wire.CodeInvalidArgument || e.Message == "" {
				t.Fatalf("%q: %#v", raw, err)
			}
			if e.Field != "" && e.Field != "stale" && e.Field != "limit" {
				t.Fatalf("%q: field %q", raw, e.Field)
			}
			return
		}
		if limit < 0 || limit > 1<<31 {
			t.Fatalf("%q: limit %d", raw, limit)
		}
		vs, _ := url.ParseQuery(raw)
		if s, ok := vs["stale"]; ok && (s[0] == "" || s[0] == "true" || s[0] == "1" || s[0] == "t" || s[0] == "TRUE" || s[0] == "True" || s[0] == "T") != stale {
			t.Fatalf("%q: stale %v", raw, stale)
		}
	})
}

// FuzzParseTokens: the tokens file parser refuses with an error and no
// tokens, or accepts tokens that each have a name, a known scope and a
// hash, and that a file written back from them (restrictions to keys and
// holders included) parses to the same set.
func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(`{"tokens":[{"name":"ops","sha256":"` + HashToken("secret") + `","scopes":["admin","read"]}]}`))
	f.Add([]byte(`{"tokens":[{"name":"a","sha256":"` + HashToken("a") + `","scopes":["read"]},{"name":"b","sha256":"` + HashToken("b") + `","scopes":["write"]}]}`))
	f.Add([]byte(`{"tokens":[]}`))
	f.Add([]byte(`{"tokens":[{"name":"x","sha256":"zz","scopes":["read"]}]} {}`))
	f.Add([]byte(`{"tokens":[{"name":"t","sha256":"` + HashToken("t") + `","scopes":["write"],"keys":{"read":["s/",""],"write":["t/","t/"]},"holders":{"names":["w"],"prefixes":["t-"]}}]}`))
	f.Add([]byte(`{"tokens":[{"name":"t","sha256":"` + HashToken("t") + `","scopes":["read"],"keys":null,"holders":{"names":[]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		toks, err := ParseTokens(data)
		if err != nil {
			if toks != nil || err.Error() == "" {
				t.Fatalf("error %v with tokens %v", err, toks)
			}
			return
		}
		if len(toks.entries()) == 0 {
			t.Fatal("accepted a file without tokens")
		}
		var out tokensFile
		for _, e := range toks.entries() {
			if e.name == "" || e.scope < ScopeRead || e.scope > ScopeAdmin {
				t.Fatalf("entry %+v", e)
			}
			fe := tokenFileEntry{Name: e.name, SHA256: hex.EncodeToString(e.sum[:]), Scopes: []string{e.scope.String()}}
			if v := e.acc.view(); v != nil {
				if v.Keys != nil {
					fe.Keys, _ = json.Marshal(v.Keys)
				}
				if v.Holders != nil {
					fe.Holders, _ = json.Marshal(v.Holders)
				}
			}
			out.Tokens = append(out.Tokens, fe)
		}
		b, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseTokens(b)
		if err != nil {
			t.Fatalf("written back as %s: %v", b, err)
		}
		if !reflect.DeepEqual(again.entries(), toks.entries()) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again.entries(), toks.entries())
		}
	})
}
