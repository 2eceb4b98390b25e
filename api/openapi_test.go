package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/leasehold/leasehold/wire"
)

// The OpenAPI document (openapi.yaml) against the server: loaded and
// validated with kin-openapi, its routes against the route table both ways,
// and (TestMain) every request and answer the package's tests exchange with
// a server New made validated against it.

var (
	specOnce   sync.Once
	specDoc    *openapi3.T
	specRouter routers.Router
	specErr    error
)

// loadSpec loads and validates the embedded document once.
func loadSpec() (*openapi3.T, routers.Router, error) {
	specOnce.Do(func() {
		l := openapi3.NewLoader()
		doc, err := l.LoadFromData(openAPIYAML)
		if err != nil {
			specErr = fmt.Errorf("load openapi.yaml: %w", err)
			return
		}
		if err := doc.Validate(l.Context); err != nil {
			specErr = fmt.Errorf("openapi.yaml does not validate: %w", err)
			return
		}
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			specErr = fmt.Errorf("route openapi.yaml: %w", err)
			return
		}
		specDoc, specRouter = doc, r
	})
	return specDoc, specRouter, specErr
}

func mustSpec(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	doc, r, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	return doc, r
}

// specServer is the server URL requests are validated under (the
// document's).
const specServer = "http://127.0.0.1:7700"

// consoleRoute reports whether a route of the table is one of the web
// console's static files, which the document leaves out (see its header).
func consoleRoute(method, path string) bool {
	return method == http.MethodGet && (path == "/" || path == "/ui" || strings.HasPrefix(path, uiPrefix))
}

// specPath turns a route table pattern into the document's (":id" ->
// "{id}").
func specPath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if strings.HasPrefix(s, ":") {
			parts[i] = "{" + s[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}

// TestOpenAPIRoutes: every route of the table (console files aside) is in
// the document, and every operation of the document is a route.
func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := mustSpec(t)
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi.yaml is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	s := New(newFake(), Options{}).(*server)
	s.control = &Control{} // the control routes too
	table := map[string]route{}
	for _, rt := range s.allRoutes() {
		if consoleRoute(rt.method, rt.path) {
			continue
		}
		table[rt.method+" "+specPath(rt.path)] = rt
	}
	documented := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			documented[name] = op
			if _, ok := op.Extensions["x-error-codes"]; !ok {
				t.Errorf("%s: no x-error-codes", name)
			}
			if (op.RequestBody == nil) != (op.Extensions["x-no-body"] == true) {
				t.Errorf("%s: x-no-body and requestBody disagree", name)
			}
		}
	}
	for name, rt := range table {
		op := documented[name]
		if op == nil {
			t.Errorf("route %s is not in openapi.yaml", name)
			continue
		}
		if takes := rt.flags&body != 0; takes != (op.RequestBody != nil) {
			t.Errorf("%s: the route takes a body: %v; the document gives it one: %v", name, takes, op.RequestBody != nil)
		}
	}
	for name := range documented {
		if _, ok := table[name]; !ok {
			t.Errorf("openapi.yaml documents %s, which is no route", name)
		}
	}
	if len(table) < 30 {
		t.Fatalf("only %d routes in the table: the walk is broken", len(table))
	}
}

// TestOpenAPIErrorCodes: every code an operation lists is a contract code,
// and its status is one the operation documents; every contract code is
// listed somewhere.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc, _ := mustSpec(t)
	used := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for _, c := range errorCodesOf(op) {
				used[c] = true
				if !wireKnown(c) {
					t.Errorf("%s %s: x-error-codes lists %s, no contract code", method, path, c)
					continue
				}
				if op.Responses.Status(wireStatus(c)) == nil {
					t.Errorf("%s %s: lists %s but documents no %d answer", method, path, c, wireStatus(c))
				}
			}
		}
	}
	for _, c := range wireCodes() {
		switch c {
		case "INTERNAL", "NOT_FOUND", "METHOD_NOT_ALLOWED":
			// INTERNAL: a bug; NOT_FOUND, METHOD_NOT_ALLOWED: the router's,
			// on every path (the document's header says so).
			if c == "NOT_FOUND" {
				continue
			}
			if !strings.Contains(string(openAPIYAML), c) {
				t.Errorf("%s is not mentioned in openapi.yaml", c)
			}
			continue
		}
		if !used[c] {
			t.Errorf("contract code %s is listed by no operation", c)
		}
	}
}

// errorCodesOf returns the operation's x-error-codes.
func errorCodesOf(op *openapi3.Operation) []string {
	raw, _ := op.Extensions["x-error-codes"].([]any)
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// TestOpenAPIServed: GET /v1/openapi.json answers the document, as JSON
// that loads to the same paths, with no token even when auth is on.
func TestOpenAPIServed(t *testing.T) {
	doc, _ := mustSpec(t)
	h := New(newFake(), Options{Tokens: testTokens(t)})
	rec := do(t, h, "GET", "/v1/openapi.json", "")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/openapi.json: %d %s", rec.Code, rec.Header())
	}
	served, err := openapi3.NewLoader().LoadFromData(rec.Body.Bytes())
	if err != nil {
		t.Fatalf("the served document does not load: %v", err)
	}
	if served.OpenAPI != doc.OpenAPI || served.Paths.Len() != doc.Paths.Len() {
		t.Fatalf("served %s with %d paths, want %s with %d", served.OpenAPI, served.Paths.Len(), doc.OpenAPI, doc.Paths.Len())
	}
	rec = do(t, h, "GET", "/v1/openapi.json", `{"x":1}`)
	wantError(t, rec, 400, "INVALID_ARGUMENT", "x")
}

// ---- the recording: every exchange of the package's tests ----

// exchange is one request and its answer, as a test's server saw them.
type exchange struct {
	method, uri          string
	reqHeader            http.Header
	reqBody              []byte
	reqCut               bool
	status               int
	respHeader           http.Header
	respBody             []byte
	respCut              bool
	test                 string
	hijacked, streamBody bool
}

const recordLimit = 1 << 20

// capBuffer keeps the first recordLimit bytes written to it.
type capBuffer struct {
	mu  sync.Mutex
	b   bytes.Buffer
	cut bool
}

func (c *capBuffer) add(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := recordLimit - c.b.Len(); len(p) > room {
		c.cut = true
		p = p[:max(room, 0)]
	}
	c.b.Write(p)
}

func (c *capBuffer) bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.b.Bytes()), c.cut
}

// teeBody records what the server reads of a request body.
type teeBody struct {
	io.ReadCloser
	buf *capBuffer
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.buf.add(p[:n])
	return n, err
}

// capWriter records the answer as the server writes it.
type capWriter struct {
	http.ResponseWriter
	mu       sync.Mutex
	status   int
	header   http.Header
	hijacked bool
	body     capBuffer
}

func (w *capWriter) note(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.status, w.header = status, w.ResponseWriter.Header().Clone()
	}
}

func (w *capWriter) WriteHeader(status int) {
	w.note(status)
	w.ResponseWriter.WriteHeader(status)
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.note(http.StatusOK)
	w.body.add(p)
	return w.ResponseWriter.Write(p)
}

func (w *capWriter) Flush() {
	w.note(http.StatusOK)
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *capWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("not hijackable")
	}
	w.mu.Lock()
	w.hijacked = true
	w.mu.Unlock()
	return h.Hijack()
}

func (w *capWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// recorder collects the checked exchanges and their failures.
var recorder struct {
	mu       sync.Mutex
	queue    chan *exchange
	wg       sync.WaitGroup
	closed   bool // the tests are over: no more exchanges are taken
	checked  int
	skipped  int
	byRoute  map[string]int
	failures map[string][]string // problem -> the first few exchanges showing it
}

// recordExchange is serveHook while the package's tests run: it serves r
// and checks the exchange against the document.
func recordExchange(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
	if unchecked.Load() > 0 {
		serve(w, r)
		recorder.mu.Lock()
		recorder.skipped++
		recorder.mu.Unlock()
		return
	}
	ex := &exchange{method: r.Method, uri: r.URL.RequestURI(), reqHeader: r.Header.Clone(), test: callingTest()}
	var reqBuf capBuffer
	if r.Body != nil && r.Body != http.NoBody {
		r = r.WithContext(r.Context())
		r.Body = &teeBody{ReadCloser: r.Body, buf: &reqBuf}
	}
	cw := &capWriter{ResponseWriter: w}
	serve(cw, r)
	ex.reqBody, ex.reqCut = reqBuf.bytes()
	cw.mu.Lock()
	ex.status, ex.respHeader, ex.hijacked = cw.status, cw.header, cw.hijacked
	cw.mu.Unlock()
	if ex.respHeader == nil {
		ex.respHeader = w.Header().Clone()
	}
	if ex.status == 0 {
		ex.status = http.StatusOK
	}
	ex.respBody, ex.respCut = cw.body.bytes()
	// Checked by checkExchanges, off the server's goroutine: a schema
	// check takes a while, and the answer ends when the handler returns.
	recorder.mu.Lock()
	if recorder.closed {
		recorder.mu.Unlock()
		return // a stream that outlived the tests
	}
	recorder.wg.Add(1)
	recorder.mu.Unlock()
	recorder.queue <- ex
}

// checkExchanges checks the recorded exchanges as they come.
func checkExchanges() {
	for ex := range recorder.queue {
		noteExchange(ex)
		recorder.wg.Done()
	}
}

func noteExchange(ex *exchange) {
	problems, route := checkExchange(ex)
	recorder.mu.Lock()
	defer recorder.mu.Unlock()
	recorder.checked++
	if recorder.byRoute == nil {
		recorder.byRoute, recorder.failures = map[string]int{}, map[string][]string{}
	}
	recorder.byRoute[route]++
	for _, p := range problems {
		if len(recorder.failures[p]) < 3 {
			recorder.failures[p] = append(recorder.failures[p], fmt.Sprintf("%s %s -> %d %.300s (%s)", ex.method, ex.uri, ex.status, ex.respBody, ex.test))
		}
	}
}

// callingTest names the test function on the stack, if the exchange was
// served on its goroutine (a ServeHTTP call; not a request to a server).
func callingTest() string {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if _, name, ok := strings.Cut(f.Function, ".Test"); ok {
			return "Test" + name
		}
		if _, name, ok := strings.Cut(f.Function, ".Fuzz"); ok {
			return "Fuzz" + name
		}
		if !more {
			return "a test's server"
		}
	}
}

// checkExchange returns what is wrong with ex according to the document,
// and the documented route it matched ("" for none).
func checkExchange(ex *exchange) ([]string, string) {
	_, router, err := loadSpec()
	if err != nil {
		return []string{err.Error()}, ""
	}
	path, _, _ := strings.Cut(ex.uri, "?")
	if consoleRoute(ex.method, path) {
		return nil, "console"
	}
	req, err := http.NewRequest(ex.method, specServer+ex.uri, bytes.NewReader(ex.reqBody))
	if err != nil {
		return []string{"unparsable request: " + err.Error()}, ""
	}
	req.Header = ex.reqHeader.Clone()
	if len(ex.reqBody) > 0 && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json") // the server reads JSON whatever the type
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		// The router's own answers are on every path.
		code := errorCode(ex.respBody)
		if ex.status == http.StatusNotFound && code == "NOT_FOUND" || ex.status == http.StatusMethodNotAllowed && code == "METHOD_NOT_ALLOWED" {
			return nil, "router"
		}
		return []string{fmt.Sprintf("%s %s: no documented route (%d %s)", ex.method, path, ex.status, code)}, ""
	}
	name := ex.method + " " + route.Path
	var problems []string
	fail := func(format string, args ...any) {
		problems = append(problems, name+": "+fmt.Sprintf(format, args...))
	}
	if ex.hijacked {
		if ex.status != http.StatusSwitchingProtocols && ex.status != 0 {
			fail("hijacked after answering %d", ex.status)
		}
		return problems, name
	}
	ctype, _, _ := strings.Cut(ex.respHeader.Get("Content-Type"), ";")
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		ExcludeResponseBody:   ctype != "application/json" || ex.respCut,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	ctx := context.Background()
	err = openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 ex.status,
		Header:                 ex.respHeader,
		Body:                   io.NopCloser(bytes.NewReader(ex.respBody)),
		Options:                opts,
	})
	if err != nil {
		fail("answer %d does not validate: %s", ex.status, shortErr(err))
	}
	if ex.status >= 400 && ctype == "application/json" {
		if code := errorCode(ex.respBody); !slices.Contains(errorCodesOf(route.Operation), code) {
			fail("error code %q is not in its x-error-codes", code)
		}
	}
	stream := route.Operation.Extensions["x-stream"] == true
	if ex.status < 300 && !stream && !ex.reqCut {
		req.Body = io.NopCloser(bytes.NewReader(ex.reqBody))
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			fail("a request answered %d does not validate: %s", ex.status, shortErr(err))
		}
	}
	if ex.status == http.StatusOK {
		switch ctype {
		case "text/event-stream":
			problems = append(problems, checkEvents(name, route.Operation, ex.respBody, ex.respCut)...)
		case "application/x-ndjson":
			problems = append(problems, checkLines(name, "KeepAliveAnswer", ex.respBody, ex.respCut)...)
		}
	}
	return problems, name
}

// shortErr is the first line of a validation error.
func shortErr(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// errorCode returns the error.code of an error body, or "".
func errorCode(body []byte) string {
	var eb struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &eb)
	return eb.Error.Code
}

// visitSchema validates a JSON value against a component schema.
func visitSchema(name string, data []byte) error {
	doc, _, err := loadSpec()
	if err != nil {
		return err
	}
	ref := doc.Components.Schemas[name]
	if ref == nil {
		return fmt.Errorf("no schema %s", name)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	return ref.Value.VisitJSON(v, openapi3.EnableJSONSchema2020())
}

// streamSample is how many lines or events of a stream are checked (a
// schema check takes a while; a stream may carry thousands).
const streamSample = 20

// checkEvents checks the messages of an event stream: each data line is an
// Event of a documented type (or, for stream_error, an error body).
func checkEvents(name string, op *openapi3.Operation, body []byte, cut bool) []string {
	var problems []string
	types, _ := op.Extensions["x-event-types"].([]any)
	known := map[string]bool{}
	for _, t := range types {
		known[fmt.Sprint(t)] = true
	}
	messages := strings.Split(string(body), "\n\n")
	if cut && len(messages) > 0 {
		messages = messages[:len(messages)-1]
	}
	if len(messages) > streamSample {
		messages = messages[:streamSample]
	}
	for _, m := range messages {
		var typ, data string
		for _, line := range strings.Split(m, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			}
		}
		if data == "" {
			continue // a comment (keep-alive)
		}
		if !known[typ] {
			problems = append(problems, fmt.Sprintf("%s: undocumented event type %q", name, typ))
		}
		schema := "Event"
		if typ == streamErrorEvent {
			schema = "ErrorBody"
		}
		if err := visitSchema(schema, []byte(data)); err != nil {
			problems = append(problems, fmt.Sprintf("%s: event %s does not validate: %s", name, typ, shortErr(err)))
		}
	}
	return problems
}

// checkLines checks each complete line of an NDJSON body against a schema.
func checkLines(name, schema string, body []byte, cut bool) []string {
	var problems []string
	lines := strings.Split(string(body), "\n")
	lines = lines[:len(lines)-1] // the last is incomplete or empty
	_ = cut
	if len(lines) > streamSample {
		lines = lines[:streamSample]
	}
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if err := visitSchema(schema, []byte(l)); err != nil {
			problems = append(problems, fmt.Sprintf("%s: line does not validate as %s: %s", name, schema, shortErr(err)))
		}
	}
	return problems
}

// unchecked, while above 0, turns the checking off (uncheckedExchanges).
var unchecked atomic.Int32

// uncheckedExchanges turns the check of exchanges against the document off
// for the rest of tb: for a test whose fake node or fake leader answers
// what no real one does (every code on one route, a leader's garbage
// passed through). The package's tests do not run in parallel.
func uncheckedExchanges(tb testing.TB) {
	unchecked.Add(1)
	tb.Cleanup(func() { unchecked.Add(-1) })
}

// reportExchanges prints what the recording found; it returns false when
// an exchange failed.
func reportExchanges() bool {
	recorder.mu.Lock()
	defer recorder.mu.Unlock()
	if len(recorder.failures) == 0 {
		if testing.Verbose() {
			fmt.Printf("openapi: %d exchanges of the package's tests validated against openapi.yaml (%d routes; %d unchecked by choice)\n", recorder.checked, len(recorder.byRoute), recorder.skipped)
		}
		return true
	}
	keys := make([]string, 0, len(recorder.failures))
	for k := range recorder.failures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("--- FAIL: openapi: %d of the tests' %d exchanges with a server do not match openapi.yaml (%d distinct problems):\n", countFailures(), recorder.checked, len(keys))
	for _, k := range keys {
		fmt.Printf("    %s\n", k)
		for _, ex := range recorder.failures[k] {
			fmt.Printf("        e.g. %s\n", ex)
		}
	}
	return false
}

func countFailures() int {
	n := 0
	for _, v := range recorder.failures {
		n += len(v)
	}
	return n
}

// TestMain records and checks every exchange of the package's tests with a
// server New made (serveHook), and fails the run if one does not match the
// document. LEASEHOLD_OPENAPI_RECORD=0 turns the recording off; a fuzzing
// run (-fuzz) never records.
func TestMain(m *testing.M) {
	flag.Parse()
	fuzzing := false
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			fuzzing = true
		}
	}
	if os.Getenv("LEASEHOLD_OPENAPI_RECORD") != "0" && !fuzzing {
		serveHook = recordExchange
	}
	if serveHook != nil {
		recorder.queue = make(chan *exchange, 1024)
		go checkExchanges()
	}
	code := m.Run()
	if serveHook != nil {
		recorder.mu.Lock()
		recorder.closed = true
		recorder.mu.Unlock()
		recorder.wg.Wait()
	}
	if serveHook != nil && !reportExchanges() && code == 0 {
		code = 1
	}
	os.Exit(code)
}

func wireKnown(c string) bool { return wire.Known(wire.Code(c)) }
func wireStatus(c string) int { return wire.HTTPStatus(wire.Code(c)) }
func wireCodes() []string {
	var out []string
	for _, c := range wire.Codes() {
		out = append(out, string(c))
	}
	return out
}

// TestOpenAPIInDocs: docs/api.md, the prose reference, names every
// operation of the document (as `METHOD /path/:param`) and every error code
// it lists, and links the document.
func TestOpenAPIInDocs(t *testing.T) {
	doc, _ := mustSpec(t)
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	if !strings.Contains(md, "(../api/openapi.yaml)") || !strings.Contains(md, "GET /v1/openapi.json") {
		t.Error("docs/api.md does not link api/openapi.yaml")
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			p := strings.NewReplacer("{", ":", "}", "").Replace(path)
			found := false
			for _, end := range []string{"`", "?", " ", "["} {
				found = found || strings.Contains(md, "`"+method+" "+p+end)
			}
			if !found {
				t.Errorf("docs/api.md does not name `%s %s`", method, p)
			}
		}
	}
	codes := doc.Components.Schemas["Code"].Value.Enum
	if len(codes) != len(wire.Codes()) {
		t.Errorf("the document lists %d codes, wire %d", len(codes), len(wire.Codes()))
	}
	for _, c := range codes {
		if !strings.Contains(md, "`"+fmt.Sprint(c)+"`") {
			t.Errorf("docs/api.md does not name the code %s", c)
		}
		if !wireKnown(fmt.Sprint(c)) {
			t.Errorf("the document's code %s is no contract code", c)
		}
	}
}
