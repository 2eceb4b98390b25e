package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// deadlineRecorder is a ResponseWriter that records the write deadlines
// set on it through http.ResponseController.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	mu        sync.Mutex
	deadlines []time.Time
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deadlines = append(d.deadlines, t)
	return nil
}

func (d *deadlineRecorder) last() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.deadlines) == 0 {
		return time.Time{}, false
	}
	return d.deadlines[len(d.deadlines)-1], true
}

// TestWriteDeadlines: an ordinary route's answer has WriteTimeout to be
// written; a local acquire gets its wait_ms on top; an event stream has no
// deadline (and does not inherit one from an earlier request on its
// connection: every request sets or lifts it).
func TestWriteDeadlines(t *testing.T) {
	const timeout = 7 * time.Second
	s := New(newFake(), Options{WriteTimeout: timeout})
	do := func(method, target, body string) *deadlineRecorder {
		var rd *strings.Reader
		if body != "" {
			rd = strings.NewReader(body)
		} else {
			rd = strings.NewReader("")
		}
		req := httptest.NewRequest(method, target, rd)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		rec := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
		s.ServeHTTP(rec, req)
		return rec
	}
	within := func(what string, rec *deadlineRecorder, want time.Duration) {
		t.Helper()
		d, ok := rec.last()
		if !ok || d.IsZero() {
			t.Fatalf("%s: no write deadline (%v)", what, rec.deadlines)
		}
		// The deadline was set during the request: it lies between now
		// minus the request's duration and now, plus want.
		if left := time.Until(d); left > want || left < want-5*time.Second {
			t.Fatalf("%s: deadline in %v, want about %v", what, left, want)
		}
	}
	within("list", do("GET", "/v1/leases", ""), timeout)
	within("cluster", do("GET", "/v1/cluster", ""), timeout)
	acq := do("POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":10000,"wait_ms":60000}`)
	within("acquire", acq, timeout+60*time.Second)
	if len(acq.deadlines) != 1 {
		t.Fatalf("acquire set its write deadline %d times (%v), want once", len(acq.deadlines), acq.deadlines)
	}
	if rec := do("POST", "/v1/leases", `{"key":"k","holder":"h","ttl_ms":"x"}`); rec.Code != 400 || len(rec.deadlines) != 1 || !rec.deadlines[0].IsZero() {
		t.Fatalf("an acquire refused before its handler set a deadline: %d, deadlines %v, want one lifted", rec.Code, rec.deadlines)
	}
	if rec := do("GET", "/v1/nowhere", ""); rec.Code != 404 {
		t.Fatalf("no route: %d", rec.Code)
	} else {
		within("no route", rec, timeout)
	}

	rec := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
	req := httptest.NewRequest("GET", "/v1/events", nil)
	ctx, cancel := contextWithCancel(req)
	req = req.WithContext(ctx)
	done := make(chan struct{})
	go func() { s.ServeHTTP(rec, req); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if d, ok := rec.last(); ok && d.IsZero() && len(rec.deadlines) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("event stream: write deadlines %v, want the request's lifted", rec.deadlines)
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	<-done
	if d, _ := rec.last(); !d.IsZero() {
		t.Fatalf("event stream ended with a write deadline %v", d)
	}
}

var _ http.ResponseWriter = (*deadlineRecorder)(nil)

func contextWithCancel(r *http.Request) (context.Context, func()) {
	return context.WithCancel(r.Context())
}
