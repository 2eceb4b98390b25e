package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// The schema-driven fuzz: requests generated from openapi.yaml, valid and
// invalid (unknown fields, wrong types, missing fields, huge numbers, bad
// UTF-8, oversized and malformed bodies, wrong headers, query and path
// parameters), sent to a real in-process node's API over HTTP. Every
// exchange must match the document (checkExchange: a documented status,
// the body's schema, a code the operation lists; no 500); a request the
// document says is invalid in a way the server must refuse is a 4xx; an
// unknown field or a body on a route that takes none is a 400 naming the
// field; no 4xx changes the state (a digest of every lease and session,
// countdowns aside, before and after).
//
// TestOpenAPIFuzz is the bounded run of `make test`: LEASEHOLD_OPENAPI_FUZZ_N
// requests (default 1000; 300 with -short) from the seed
// LEASEHOLD_OPENAPI_FUZZ_SEED (default: a random one, printed). FuzzOpenAPI
// is the long run of `make fuzz`: each input is a seed of 16 requests.

// fuzzEnv is a real node served over HTTP, and what the fuzz knows of its
// state to make valid requests.
type fuzzEnv struct {
	n       *node.Node
	srv     *httptest.Server
	client  *http.Client
	ops     []fuzzOp
	mu      sync.Mutex
	leases  []fuzzCred // lease id and token
	groups  []fuzzCred
	session []fuzzCred
	fencing []uint64
}

type fuzzCred struct{ id, token string }

type fuzzOp struct {
	method, path string
	op           *openapi3.Operation
}

// fuzzProblems collects what checkExchange finds in the fuzz's exchanges.
type fuzzSink struct {
	mu       sync.Mutex
	problems []string
}

func newFuzzEnv(tb testing.TB) *fuzzEnv {
	tb.Helper()
	doc, _ := mustSpec(tb)
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e := &fuzzEnv{n: n, client: &http.Client{Timeout: 60 * time.Second}}
	s := New(FromNode(n), Options{}).(*server)
	e.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP)) // checked by the fuzz itself, not the recording
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := e.client.Get(e.srv.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("the node is not ready after 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if path == "/v1/control/ws" {
				continue // a WebSocket: control_ws_fuzz_test.go
			}
			e.ops = append(e.ops, fuzzOp{method, path, op})
		}
	}
	sort.Slice(e.ops, func(i, j int) bool {
		return e.ops[i].path+e.ops[i].method < e.ops[j].path+e.ops[j].method
	})
	// A few leases, a session and a group to act on.
	for i := range 3 {
		e.send(tb, "POST", "/v1/leases", nil, fmt.Sprintf(`{"key":"fz/seed%d","holder":"fz-a","ttl_ms":600000}`, i))
	}
	e.send(tb, "POST", "/v1/sessions", nil, `{"holder":"fz-b","ttl_ms":600000}`)
	e.send(tb, "POST", "/v1/groups", nil, `{"keys":[{"key":"fz/g1"},{"key":"fz/g2"}],"holder":"fz-c","ttl_ms":600000}`)
	return e
}

func (e *fuzzEnv) close() {
	e.srv.Close()
	e.n.Close()
}

// send is a plain request of the setup.
func (e *fuzzEnv) send(tb testing.TB, method, path string, hdr http.Header, body string) {
	tb.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := e.client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		tb.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	e.learn(path, method, resp.StatusCode, b)
}

// learn remembers the ids and tokens of what a 2xx answer created.
func (e *fuzzEnv) learn(path, method string, status int, b []byte) {
	if status != 201 || method != "POST" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	keep := func(list []fuzzCred, c fuzzCred) []fuzzCred {
		if c.id == "" || c.token == "" {
			return list
		}
		if len(list) >= 16 {
			list = list[1:]
		}
		return append(list, c)
	}
	switch path {
	case "/v1/leases":
		var l wire.Lease
		if json.Unmarshal(b, &l) == nil {
			e.leases = keep(e.leases, fuzzCred{l.LeaseID, l.Token})
			e.fencing = append(e.fencing, l.FencingToken)
		}
	case "/v1/sessions":
		var s wire.Session
		if json.Unmarshal(b, &s) == nil {
			e.session = keep(e.session, fuzzCred{s.SessionID, s.Token})
		}
	case "/v1/groups":
		var g wire.LeaseGroup
		if json.Unmarshal(b, &g) == nil {
			e.groups = keep(e.groups, fuzzCred{g.GroupID, g.Token})
		}
	}
}

// digest is the state a refused request must not change: every lease and
// session with its state, counters and metadata (countdowns, which move
// with the ticks, aside).
func (e *fuzzEnv) digest(tb testing.TB) string {
	ctx := context.Background()
	h := sha256.New()
	after := ""
	for {
		list, err := e.n.ListLeases(ctx, wire.ListRequest{After: after, Limit: 1000}, true)
		if err != nil {
			tb.Fatalf("digest: %v", err)
		}
		for _, l := range list.Leases {
			md, _ := json.Marshal(l.Metadata)
			fmt.Fprintf(h, "L %s %q %q %d %s %s %s %d %d %d %s %q %v|", l.LeaseID, l.Key, l.Holder, l.Limit, l.SessionID, l.GroupID,
				l.State, l.FencingToken, l.TTLMS, l.RenewalCount, md, l.EndReason, l.LastRenewedAt)
		}
		if after = list.Next; after == "" {
			break
		}
	}
	after = ""
	for {
		list, err := e.n.ListSessions(ctx, "", after, 1000, true)
		if err != nil {
			tb.Fatalf("digest: %v", err)
		}
		for _, s := range list.Sessions {
			md, _ := json.Marshal(s.Metadata)
			fmt.Fprintf(h, "S %s %q %s %d %d %s %q %v %v|", s.SessionID, s.Holder, s.State, s.TTLMS, s.HeartbeatCount, md, s.EndReason, s.LeaseIDs, s.LastHeartbeat)
		}
		if after = list.Next; after == "" {
			break
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The kinds of invalid request.
const (
	mutUnknownField = iota // a field no schema has (or a body where none is taken)
	mutWrongType           // a property of another JSON type
	mutMissing             // a required property left out
	mutHugeNumber          // an integer no int64 or uint64 holds, or a float
	mutBadUTF8             // invalid UTF-8 in a string
	mutOversized           // a body over the 64 KiB limit
	mutMalformed           // JSON cut short
	mutNotObject           // a JSON value that is not an object
	mutHeader              // a required header left out, or a wrong one
	mutQuery               // a typed query parameter with a wrong value
	mutPath                // a path parameter no resource has
	mutKinds
)

var mutNames = [...]string{"unknown field", "wrong type", "missing field", "huge number", "bad UTF-8", "oversized body",
	"malformed JSON", "not an object", "wrong header", "wrong query", "wrong path"}

// fuzzReq is one generated request and what the fuzz expects of it.
type fuzzReq struct {
	op     fuzzOp
	path   string
	query  url.Values
	header http.Header
	body   []byte
	// mut is the mutation (-1: none, a valid request); mustRefuse: the
	// server must answer it 4xx; field: the field a 400 must name.
	mut        int
	mustRefuse bool
	field      string
	what       string
}

// gen makes requests from the document with rng.
type gen struct {
	e   *fuzzEnv
	rng *rand.Rand
}

func (g *gen) pick(list []fuzzCred, missing string) fuzzCred {
	g.e.mu.Lock()
	defer g.e.mu.Unlock()
	if len(list) == 0 || g.rng.IntN(10) == 0 {
		return fuzzCred{missing, "not-a-token-" + strconv.Itoa(g.rng.IntN(100))}
	}
	return list[g.rng.IntN(len(list))]
}

// request makes one request for op, valid, then mutated unless valid.
func (g *gen) request(op fuzzOp, valid bool) *fuzzReq {
	r := &fuzzReq{op: op, query: url.Values{}, header: http.Header{}, mut: -1}
	// The resource the path names, and its credentials.
	var cred fuzzCred
	path := op.path
	switch {
	case strings.HasPrefix(path, "/v1/leases/{id}"):
		cred = g.pick(g.e.leases, "ls_0000000000000000")
	case strings.HasPrefix(path, "/v1/groups/{id}"):
		cred = g.pick(g.e.groups, "lg_0000000000000000")
	case strings.HasPrefix(path, "/v1/sessions/{id}"):
		cred = g.pick(g.e.session, "ss_0000000000000000")
	case strings.HasPrefix(path, "/v1/cluster/members/{id}"):
		cred = fuzzCred{id: "fz-no-such-server"}
	}
	path = strings.Replace(path, "{id}", url.PathEscape(cred.id), 1)
	path = strings.Replace(path, "{holder}", url.PathEscape(g.holder()), 1)
	r.path = path
	for _, pr := range op.op.Parameters {
		p := pr.Value
		switch p.In {
		case "query":
			if g.rng.IntN(2) == 0 {
				r.query.Set(p.Name, g.queryValue(op, p.Name, p.Schema.Value))
			}
		case "header":
			switch p.Name {
			case "X-Lease-Token":
				if p.Required || op.method == "DELETE" || g.rng.IntN(3) == 0 {
					r.header.Set(p.Name, cred.token)
				}
			case "X-Session-Token":
				if p.Required || path == "/v1/leases" && g.rng.IntN(3) == 0 {
					s := g.pick(g.e.session, "")
					r.header.Set(p.Name, s.token)
				} else if strings.HasPrefix(op.path, "/v1/sessions/{id}") && g.rng.IntN(2) == 0 {
					r.header.Set(p.Name, cred.token)
				}
			}
		}
	}
	if op.op.RequestBody != nil {
		switch ct := op.op.RequestBody.Value.Content; {
		case ct.Get("application/json") != nil:
			v := g.value("", ct.Get("application/json").Schema, 0)
			r.body, _ = json.Marshal(v)
		case ct.Get("application/x-ndjson") != nil:
			var lines []string
			for i := range 1 + g.rng.IntN(3) {
				l := g.pick(g.e.leases, "ls_0000000000000000")
				lines = append(lines, fmt.Sprintf(`{"id":%d,"lease_id":%q,"token":%q,"ttl_ms":600000}`, i+1, l.id, l.token))
			}
			r.body = []byte(strings.Join(lines, "\n") + "\n")
		case ct.Get("application/octet-stream") != nil:
			// Not a snapshot file: always refused (a valid restore would
			// replace the state the fuzz acts on).
			r.body = []byte("LEASEHOLD-SNAPSHOT " + strings.Repeat("x", g.rng.IntN(200)) + "\n")
			r.mustRefuse, r.mut, r.what = true, mutMalformed, "not a snapshot file"
			return r
		}
	}
	if !valid {
		g.mutate(r)
	}
	return r
}

func (g *gen) holder() string { return []string{"fz-a", "fz-b", "fz-c", "fz-d"}[g.rng.IntN(4)] }

// queryValue is a valid value of a query parameter.
func (g *gen) queryValue(op fuzzOp, name string, s *openapi3.Schema) string {
	switch name {
	case "stale":
		return strconv.FormatBool(g.rng.IntN(2) == 0)
	case "limit":
		return strconv.Itoa(1 + g.rng.IntN(1000))
	case "after_index":
		return strconv.Itoa(g.rng.IntN(1000))
	case "hash_at":
		return "1" // long applied: 409 INDEX_PASSED at once
	case "timeout_ms":
		return strconv.Itoa(1 + g.rng.IntN(50))
	case "key", "prefix":
		return "fz/"
	case "holder":
		return g.holder()
	case "session_id":
		return g.pick(g.e.session, "ss_0000000000000000").id
	case "after":
		return ""
	case "reason":
		return "fuzz"
	}
	if len(s.Enum) > 0 {
		return fmt.Sprint(s.Enum[g.rng.IntN(len(s.Enum))])
	}
	return "x"
}

// value is a valid value of schema ref for a property called name.
func (g *gen) value(name string, ref *openapi3.SchemaRef, depth int) any {
	s := ref.Value
	if len(s.AllOf) > 0 {
		return g.value(name, s.AllOf[0], depth)
	}
	if len(s.AnyOf) > 0 {
		for _, alt := range s.AnyOf {
			if alt.Value.Type == nil || !alt.Value.Type.Is("null") {
				return g.value(name, alt, depth)
			}
		}
	}
	if s.Const != nil {
		return s.Const
	}
	if len(s.Enum) > 0 {
		return s.Enum[g.rng.IntN(len(s.Enum))]
	}
	switch {
	case s.Type.Includes("object"):
		if len(s.Properties) == 0 {
			if g.rng.IntN(4) == 0 {
				return map[string]any{}
			}
			return map[string]any{"worker": "fz", "n": strconv.Itoa(g.rng.IntN(100))}
		}
		obj := map[string]any{}
		names := make([]string, 0, len(s.Properties))
		for n := range s.Properties {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			required := false
			for _, r := range s.Required {
				required = required || r == n
			}
			if required || g.rng.IntN(2) == 0 {
				obj[n] = g.value(n, s.Properties[n], depth+1)
			}
		}
		// An item naming a lease carries its token.
		if _, ok := obj["lease_id"]; ok {
			c := g.pick(g.e.leases, "ls_0000000000000000")
			obj["lease_id"] = c.id
			if _, ok := obj["token"]; ok || g.rng.IntN(4) != 0 {
				obj["token"] = c.token
			}
		}
		// A standalone acquire needs a TTL; a bound one a session.
		if _, ok := obj["holder"]; ok && name == "" {
			if _, ok := obj["ttl_ms"]; !ok {
				if _, ok := obj["session_id"]; !ok {
					obj["ttl_ms"] = 600000
				}
			}
		}
		if _, ok := obj["session_id"]; ok {
			delete(obj, "ttl_ms")
		}
		if _, ok := obj["key"]; ok && name == "" {
			if _, ok := obj["fencing_token"]; ok {
				g.e.mu.Lock()
				if len(g.e.fencing) > 0 {
					obj["fencing_token"] = g.e.fencing[g.rng.IntN(len(g.e.fencing))]
				}
				g.e.mu.Unlock()
			}
		}
		return obj
	case s.Type.Includes("array"):
		n := 1 + g.rng.IntN(2)
		out := make([]any, 0, n)
		for i := range n {
			v := g.value(name, s.Items, depth+1)
			if m, ok := v.(map[string]any); ok && name == "keys" {
				m["key"] = fmt.Sprintf("fz/grp%d-%d", g.rng.IntN(4), i) // distinct keys
			}
			out = append(out, v)
		}
		return out
	case s.Type.Includes("string"):
		switch name {
		case "key":
			return fmt.Sprintf("fz/k%d", g.rng.IntN(8))
		case "holder":
			return g.holder()
		case "session_id":
			return g.pick(g.e.session, "ss_0000000000000000").id
		case "idempotency_key":
			return "idem-" + strconv.Itoa(g.rng.IntN(1000))
		case "id":
			return "" // transfer to any voter
		}
		return "fz"
	case s.Type.Includes("integer"):
		switch name {
		case "ttl_ms":
			return 600000
		case "wait_ms", "lock_delay_ms":
			return 0
		case "limit":
			return 1
		case "id":
			return 1 + g.rng.IntN(100)
		}
		return g.rng.IntN(100)
	case s.Type.Includes("boolean"):
		return g.rng.IntN(2) == 0
	}
	return nil
}

// mutate makes r invalid in one way, and says what the server owes it.
func (g *gen) mutate(r *fuzzReq) {
	m := g.rng.IntN(mutKinds)
	r.mut, r.what = m, mutNames[m]
	var obj map[string]any
	isJSON := r.op.op.RequestBody != nil && r.op.op.RequestBody.Value.Content.Get("application/json") != nil
	if isJSON {
		_ = json.Unmarshal(r.body, &obj)
	}
	hasBody := r.op.op.RequestBody != nil
	stream := r.op.op.Extensions["x-stream"] == true
	props := func() []string {
		var out []string
		for k := range obj {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	switch m {
	case mutUnknownField:
		name := "bogus_" + strconv.Itoa(g.rng.IntN(100))
		if obj == nil {
			obj = map[string]any{}
		}
		obj[name] = 1
		r.body, _ = json.Marshal(obj)
		if !hasBody || isJSON {
			r.mustRefuse, r.field = true, name
		}
	case mutWrongType:
		ps := props()
		if len(ps) == 0 {
			r.body, r.mustRefuse, r.what = []byte(`"not an object"`), !stream, "not an object"
			return
		}
		p := ps[g.rng.IntN(len(ps))]
		switch obj[p].(type) {
		case string:
			obj[p] = 12345
		case float64:
			obj[p] = "12345"
		case bool:
			obj[p] = "yes"
		case map[string]any:
			obj[p] = []any{"x"}
		case []any:
			obj[p] = map[string]any{"x": 1}
		default:
			obj[p] = true
		}
		r.body, _ = json.Marshal(obj)
		r.mustRefuse, r.field = true, p
	case mutMissing:
		if !isJSON {
			return
		}
		req := r.op.op.RequestBody.Value.Content.Get("application/json").Schema.Value.Required
		if len(req) == 0 {
			return
		}
		delete(obj, req[g.rng.IntN(len(req))])
		r.body, _ = json.Marshal(obj)
		// Whether the server refuses it: the recording's check of a 2xx
		// request against the document says.
	case mutHugeNumber:
		huge := []string{"1e300", "18446744073709551616", "-9223372036854775809", "1.5", "-1e19"}[g.rng.IntN(5)]
		var nums []string
		for _, p := range props() {
			if _, ok := obj[p].(float64); ok {
				nums = append(nums, p)
			}
		}
		if len(nums) == 0 {
			if !isJSON {
				return
			}
			nums = []string{"ttl_ms"}
			if _, known := r.op.op.RequestBody.Value.Content.Get("application/json").Schema.Value.Properties["ttl_ms"]; !known {
				return
			}
		}
		p := nums[g.rng.IntN(len(nums))]
		obj[p] = json.RawMessage(huge)
		r.body, _ = json.Marshal(obj)
		r.mustRefuse, r.field = true, p
	case mutBadUTF8:
		var strs []string
		for _, p := range props() {
			if _, ok := obj[p].(string); ok {
				strs = append(strs, p)
			}
		}
		if len(strs) == 0 {
			return
		}
		p := strs[g.rng.IntN(len(strs))]
		obj[p] = "\u0000placeholder\u0000"
		b, _ := json.Marshal(obj)
		r.body = bytes.Replace(b, []byte(`\u0000placeholder\u0000`), []byte("fz\xff\xfe\xc0"), 1)
		r.mustRefuse = true
	case mutOversized:
		if stream {
			return
		}
		r.body = []byte(`{"reason":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}`)
		r.mustRefuse = true
	case mutMalformed:
		if len(r.body) < 2 || stream {
			r.body = []byte(`{"key":`)
		} else {
			r.body = r.body[:g.rng.IntN(len(r.body)-1)+1]
		}
		r.mustRefuse = !stream && len(bytes.TrimSpace(r.body)) > 0
	case mutNotObject:
		if stream {
			return
		}
		r.body = []byte([]string{`[]`, `"x"`, `17`, `[{"key":"k"}]`, `{} {}`}[g.rng.IntN(5)])
		r.mustRefuse = true
	case mutHeader:
		for _, pr := range r.op.op.Parameters {
			if p := pr.Value; p.In == "header" && p.Required {
				r.header.Del(p.Name)
				r.mustRefuse = true
				return
			}
		}
		switch g.rng.IntN(3) {
		case 0:
			r.header.Set("X-Lease-Token", strings.Repeat("t", 4000))
		case 1:
			r.header.Set("X-Session-Token", "not a token !")
		default:
			r.header.Set("Last-Event-ID", "zz-top")
		}
	case mutQuery:
		for _, pr := range r.op.op.Parameters {
			p := pr.Value
			if p.In != "query" {
				continue
			}
			s := p.Schema.Value
			switch {
			case s.Type.Includes("integer"):
				r.query.Set(p.Name, []string{"-1", "x", "1.5", "99999999999999999999999"}[g.rng.IntN(4)])
			case s.Type.Includes("boolean"):
				r.query.Set(p.Name, "maybe")
			case len(s.Enum) > 0:
				r.query.Set(p.Name, "no-such-value")
			default:
				continue
			}
			// A negative limit or after_index is refused, and so is
			// anything not a number; the server's own bounds say the rest.
			r.mustRefuse = p.Name != "limit" || r.query.Get(p.Name) != "-1"
			if p.Name == "limit" && r.query.Get(p.Name) == "-1" {
				r.mustRefuse = true
			}
			return
		}
	case mutPath:
		if !strings.Contains(r.op.path, "{") {
			return
		}
		bad := []string{"%ff%fe", strings.Repeat("z", 600), "ls_%2F..%2F", "%00"}[g.rng.IntN(4)]
		parts := strings.Split(r.op.path, "/")
		out := strings.Split(r.path, "/")
		for i := range parts {
			if strings.HasPrefix(parts[i], "{") {
				out[i] = bad
			}
		}
		r.path = strings.Join(out, "/")
	}
}

// fuzzStats counts a run.
type fuzzStats struct {
	requests, invalid int
	byStatus          map[int]int
	took              map[string]time.Duration // route -> time in all
	refused           map[string]int           // mutation -> 4xx
}

// run sends r, checks the exchange and the invariants, and learns from a
// 2xx. It returns the problems found.
func (e *fuzzEnv) run(tb testing.TB, r *fuzzReq, st *fuzzStats) []string {
	target := r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}
	before := e.digest(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.op.method, e.srv.URL+target, bytes.NewReader(r.body))
	if err != nil {
		return nil // a path the client refuses to send
	}
	if len(r.body) == 0 {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if len(r.body) > 0 && r.op.op.RequestBody != nil && r.op.op.RequestBody.Value.Content.Get("application/json") != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	sent := time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		return []string{fmt.Sprintf("%s %s (%s): no answer: %v", r.op.method, target, r.what, err)}
	}
	if st.took != nil {
		defer func() { st.took[r.op.method+" "+r.op.path] += time.Since(sent) }()
	}
	var body []byte
	cut := false
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		// A stream runs until its client goes: what is already there.
		time.AfterFunc(30*time.Millisecond, cancel)
		body, _ = io.ReadAll(io.LimitReader(resp.Body, recordLimit))
		cut = true
	} else {
		body, err = io.ReadAll(io.LimitReader(resp.Body, recordLimit+1))
		cut = err != nil || len(body) > recordLimit
	}
	resp.Body.Close()
	st.requests++
	st.byStatus[resp.StatusCode]++
	ex := &exchange{method: r.op.method, uri: req.URL.RequestURI(), reqHeader: req.Header, reqBody: r.body,
		status: resp.StatusCode, respHeader: resp.Header, respBody: body, respCut: cut}
	problems, _ := checkExchange(ex)
	name := fmt.Sprintf("%s %s (%s)", r.op.method, r.op.path, r.what)
	if r.mut < 0 {
		name = fmt.Sprintf("%s %s (valid)", r.op.method, r.op.path)
	} else {
		st.invalid++
	}
	status := resp.StatusCode
	if status >= 400 && status < 500 && r.mut >= 0 {
		st.refused[r.what]++
	}
	if r.mustRefuse && (status < 400 || status >= 500) {
		problems = append(problems, fmt.Sprintf("%s: answered %d to an invalid request: %.200s", name, status, body))
	}
	if r.field != "" && status == 400 {
		var eb errorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != nil && eb.Error.Field != r.field && r.mut == mutUnknownField {
			problems = append(problems, fmt.Sprintf("%s: 400 names field %q, want %q", name, eb.Error.Field, r.field))
		}
	}
	if status >= 400 && status < 500 {
		if after := e.digest(tb); after != before {
			problems = append(problems, fmt.Sprintf("%s: answered %d, yet the state changed", name, status))
		}
	}
	if status < 300 {
		e.learn(r.op.path, r.op.method, status, body)
	}
	for i, p := range problems {
		if !strings.Contains(p, "e.g.") {
			problems[i] = fmt.Sprintf("%s\n        e.g. %s %s %.300q -> %d %.300s", p, r.op.method, target, r.body, status, body)
		}
	}
	return problems
}

// fuzzSeed is LEASEHOLD_OPENAPI_FUZZ_SEED, or a random seed.
func fuzzSeed(tb testing.TB) uint64 {
	if v := os.Getenv("LEASEHOLD_OPENAPI_FUZZ_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			tb.Fatalf("LEASEHOLD_OPENAPI_FUZZ_SEED=%q: %v", v, err)
		}
		return n
	}
	return rand.Uint64()
}

// TestOpenAPIFuzz: the bounded schema-driven fuzz (see the file's comment).
func TestOpenAPIFuzz(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 300
	}
	if v := os.Getenv("LEASEHOLD_OPENAPI_FUZZ_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("LEASEHOLD_OPENAPI_FUZZ_N=%q: %v", v, err)
		}
	}
	seed := fuzzSeed(t)
	t.Logf("seed %d (replay: LEASEHOLD_OPENAPI_FUZZ_SEED=%d), %d requests", seed, seed, n)
	e := newFuzzEnv(t)
	defer e.close()
	g := &gen{e: e, rng: rand.New(rand.NewPCG(seed, seed^0x5eed))}
	st := &fuzzStats{byStatus: map[int]int{}, refused: map[string]int{}, took: map[string]time.Duration{}}
	seen := map[string]bool{}
	failures := 0
	start := time.Now()
	for i := range n {
		op := e.ops[g.rng.IntN(len(e.ops))]
		r := g.request(op, g.rng.IntN(2) == 0)
		for _, p := range e.run(t, r, st) {
			failures++
			key, _, _ := strings.Cut(p, "\n")
			if !seen[key] && len(seen) < 40 {
				seen[key] = true
				t.Errorf("request %d (seed %d): %s", i, seed, p)
			}
		}
	}
	t.Logf("%d requests (%d invalid) in %v; statuses %v; refused by mutation %v; %d problems",
		st.requests, st.invalid, time.Since(start).Round(time.Millisecond), st.byStatus, st.refused, failures)
	slow := make([]string, 0, len(st.took))
	for k := range st.took {
		slow = append(slow, k)
	}
	sort.Slice(slow, func(i, j int) bool { return st.took[slow[i]] > st.took[slow[j]] })
	for _, k := range slow[:min(3, len(slow))] {
		t.Logf("slowest route: %s, %v in all", k, st.took[k].Round(time.Millisecond))
	}
	if st.byStatus[200]+st.byStatus[201] == 0 || st.requests < n/2 {
		t.Fatalf("the fuzz did not exercise the server: %v", st.byStatus)
	}
}

var (
	fuzzEnvOnce sync.Once
	sharedFuzz  *fuzzEnv
)

// FuzzOpenAPI: the long run of `make fuzz`; each input is a seed of 16
// requests, against one node for the whole run.
func FuzzOpenAPI(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 0xdeadbeef} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		fuzzEnvOnce.Do(func() { sharedFuzz = newFuzzEnv(t) })
		e := sharedFuzz
		if e == nil {
			t.Skip("no fuzz environment")
		}
		g := &gen{e: e, rng: rand.New(rand.NewPCG(seed, seed^0x5eed))}
		st := &fuzzStats{byStatus: map[int]int{}, refused: map[string]int{}}
		for range 16 {
			op := e.ops[g.rng.IntN(len(e.ops))]
			for _, p := range e.run(t, g.request(op, g.rng.IntN(2) == 0), st) {
				t.Error(p)
			}
		}
	})
}
