package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// sseMessage is one parsed Server-Sent Events message.
type sseMessage struct {
	id, event, data string
	comment         bool
}

// readSSE reads the next message (or comment) from a stream.
func readSSE(t *testing.T, br *bufio.Reader) (sseMessage, error) {
	t.Helper()
	var m sseMessage
	seen := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if seen {
				return m, nil
			}
			continue
		}
		seen = true
		if strings.HasPrefix(line, ":") {
			m.comment = true
			continue
		}
		name, value, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("malformed SSE line %q", line)
		}
		switch name {
		case "id":
			m.id = value
		case "event":
			m.event = value
		case "data":
			if m.data != "" {
				t.Fatalf("multi-line data: %q", line)
			}
			m.data = value
		default:
			t.Fatalf("unexpected SSE field %q", line)
		}
	}
}

// newStreamServer serves New(f, opts) until the test ends; it is closed
// after the test's streams (cleanups run last-registered first).
func newStreamServer(t *testing.T, f *fakeNode, opts Options) *httptest.Server {
	srv := httptest.NewServer(New(f, opts))
	t.Cleanup(srv.Close)
	return srv
}

// openStream starts GET target on srv and returns the answer; the request
// is cut off when the test ends or after 5 s.
func openStream(t *testing.T, srv *httptest.Server, target string, hdr ...string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, cancel
}

func TestEventsFraming(t *testing.T) {
	f := newFake()
	srv := newStreamServer(t, f, Options{KeepAlive: time.Hour})

	resp, _ := openStream(t, srv, "/v1/events?key=k&prefix=p&holder=h&after_index=3", "Last-Event-ID", "5-1")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if got := resp.Header.Get(headerIndex); got != "42" {
		t.Errorf("%s = %q", headerIndex, got)
	}
	c := f.only(t, "Subscribe")
	want := wire.EventFilter{Key: "k", Prefix: "p", Holder: "h", After: "5-1"}
	if c.args[0] != want {
		t.Errorf("filter = %+v, want %+v (Last-Event-ID wins over after_index)", c.args[0], want)
	}

	granted := testLease("ls_6")
	granted.Token = "must-not-leak"
	f.sub.ch <- wire.Event{ID: "6-0", Index: 6, Type: "acquired", Tick: 9, Key: "k", Lease: granted, Previous: "ls_2"}
	f.sub.ch <- wire.Event{ID: "7-0", Index: 7, Type: "released", Tick: 10, Key: "k", Reason: "done"}

	br := bufio.NewReader(resp.Body)
	m, err := readSSE(t, br)
	if err != nil {
		t.Fatal(err)
	}
	if m.id != "6-0" || m.event != "acquired" {
		t.Errorf("first message = %+v", m)
	}
	var ev wire.Event
	if err := json.Unmarshal([]byte(m.data), &ev); err != nil {
		t.Fatalf("data %q: %v", m.data, err)
	}
	if ev.Index != 6 || ev.Type != "acquired" || ev.Tick != 9 || ev.Lease == nil || ev.Lease.LeaseID != "ls_6" || ev.Previous != "ls_2" {
		t.Errorf("event = %+v", ev)
	}
	if strings.Contains(m.data, "must-not-leak") {
		t.Errorf("event carries the lease token: %s", m.data)
	}
	m, err = readSSE(t, br)
	if err != nil {
		t.Fatal(err)
	}
	if m.id != "7-0" || m.event != "released" || !strings.Contains(m.data, `"reason":"done"`) {
		t.Errorf("second message = %+v", m)
	}
}

func TestEventsPosition(t *testing.T) {
	tests := []struct {
		query string
		want  wire.EventFilter
	}{
		{"", wire.EventFilter{}},
		{"?after_index=12", wire.EventFilter{AfterIndex: 12}},
		{"?from=start", wire.EventFilter{FromStart: true}},
		{"?from=now&prefix=jobs%2F", wire.EventFilter{Prefix: "jobs/"}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			f := newFake()
			f.sub.end(nil)
			rec := do(t, New(f, Options{}), "GET", "/v1/events"+tt.query, "")
			if rec.Code != 200 {
				t.Fatalf("status %d %s", rec.Code, rec.Body)
			}
			if c := f.only(t, "Subscribe"); c.args[0] != tt.want {
				t.Errorf("filter = %+v, want %+v", c.args[0], tt.want)
			}
		})
	}
}

func TestEventsBadRequests(t *testing.T) {
	for _, tt := range []struct{ query, field string }{
		{"?from=yesterday", "from"},
		{"?after_index=x", "after_index"},
		{"?after_index=-1", "after_index"},
	} {
		f := newFake()
		wantError(t, do(t, New(f, Options{}), "GET", "/v1/events"+tt.query, ""), 400, wire.CodeInvalidArgument, tt.field)
		if len(f.called()) != 0 {
			t.Errorf("%s reached the node", tt.query)
		}
	}
}

func TestEventsCompacted(t *testing.T) {
	f := newFake()
	f.err = &wire.Error{Code: wire.CodeEventsCompacted, Message: "history starts at 100"}
	rec := do(t, New(f, Options{}), "GET", "/v1/events?after_index=3", "")
	wantError(t, rec, 410, wire.CodeEventsCompacted, "")
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
}

func TestEventsKeepAlive(t *testing.T) {
	f := newFake()
	srv := newStreamServer(t, f, Options{KeepAlive: 5 * time.Millisecond})
	resp, _ := openStream(t, srv, "/v1/events")
	m, err := readSSE(t, bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatal(err)
	}
	if !m.comment || m.event != "" || m.data != "" {
		t.Errorf("message = %+v, want a keep-alive comment", m)
	}
}

// TestEventsClientGone: when the client goes away the handler returns and
// closes the subscription.
func TestEventsClientGone(t *testing.T) {
	f := newFake()
	srv := newStreamServer(t, f, Options{KeepAlive: time.Hour})
	_, cancel := openStream(t, srv, "/v1/events")
	cancel()
	waitClosed(t, "the subscription to be closed", f.sub.closed)
}

// TestEventsNodeEnds: when the node ends the subscription on an error, the
// stream's last message is a stream_error event and then it ends.
func TestEventsNodeEnds(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		code wire.Code
	}{
		{"slow subscriber", &wire.Error{Code: wire.CodeEventsCompacted, Message: "fell behind"}, wire.CodeEventsCompacted},
		{"internal", errors.New("ring: index 7 out of range"), wire.CodeInternal},
		{"clean", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			srv := newStreamServer(t, f, Options{KeepAlive: time.Hour})
			resp, _ := openStream(t, srv, "/v1/events")
			f.sub.ch <- wire.Event{ID: "1-0", Index: 1, Type: "session_created"}
			f.sub.end(tt.err)
			br := bufio.NewReader(resp.Body)
			if m, err := readSSE(t, br); err != nil || m.id != "1-0" {
				t.Fatalf("first message = %+v, %v", m, err)
			}
			if tt.err != nil {
				m, err := readSSE(t, br)
				if err != nil {
					t.Fatal(err)
				}
				var body errorBody
				if err := json.Unmarshal([]byte(m.data), &body); err != nil || m.event != streamErrorEvent || m.id != "" ||
					body.Error == nil || body.Error.Code != tt.code {
					t.Fatalf("last message = %+v (%v)", m, err)
				}
				if strings.Contains(m.data, "ring") {
					t.Errorf("internal error leaked: %s", m.data)
				}
			}
			if m, err := readSSE(t, br); !errors.Is(err, io.EOF) {
				t.Fatalf("after the end: %+v, %v; want EOF", m, err)
			}
			waitClosed(t, "the subscription to be closed", f.sub.closed)
		})
	}
}

func TestEventsAuth(t *testing.T) {
	f := newFake()
	f.sub.end(nil)
	h := New(f, Options{Tokens: testTokens(t)})
	wantError(t, do(t, h, "GET", "/v1/events", ""), 401, wire.CodeUnauthenticated, "")
	if len(f.called()) != 0 {
		t.Fatal("an unauthenticated stream reached the node")
	}
	if rec := do(t, h, "GET", "/v1/events", "", "Authorization", "Bearer "+readToken); rec.Code != 200 {
		t.Fatalf("read token: status %d", rec.Code)
	}
}
