package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// TestStatusFor is the contract's error table: every code to its status.
func TestStatusFor(t *testing.T) {
	tests := []struct {
		code wire.Code
		want int
	}{
		{wire.CodeInvalidArgument, 400},
		{wire.CodeUnauthenticated, 401},
		{wire.CodePermissionDenied, 403},
		{wire.CodeLeaseTokenInvalid, 403},
		{wire.CodeLeaseNotFound, 404},
		{wire.CodeSessionNotFound, 404},
		{wire.CodeLeaseHeld, 409},
		{wire.CodeLimitMismatch, 409},
		{wire.CodeLockDelay, 409},
		{wire.CodeLeaseExpired, 409},
		{wire.CodeLeaseReleased, 409},
		{wire.CodeLeaseRevoked, 409},
		{wire.CodeSessionEnded, 409},
		{wire.CodeIdempotencyConflict, 409},
		{wire.CodePayloadTooLarge, 413},
		{wire.CodeLeaseRequired, 428},
		{wire.CodeControlLocked, 409},
		{wire.CodeIndexPassed, 409},
		{wire.CodeNoLeader, 503},
		{wire.CodeIndeterminate, 504},
		{wire.CodeEventsCompacted, 410},
		{wire.CodeNotFound, 404},
		{wire.CodeUnavailable, 503},
		{wire.CodeMethodNotAllowed, 405},
		{wire.CodeInternal, 500},
		{wire.CodeLeaseInvalid, 403},
		{"SOMETHING_NEW", 500},
		{"", 500},
	}
	for _, tt := range tests {
		if got := statusFor(tt.code); got != tt.want {
			t.Errorf("statusFor(%q) = %d, want %d", tt.code, got, tt.want)
		}
	}
}

// TestErrorStatusIsWireTable: every contract code answered through a real
// route, and through the control lease's error path, gets the status of
// wire's one table and keeps its code (INTERNAL's message is replaced).
func TestErrorStatusIsWireTable(t *testing.T) {
	uncheckedExchanges(t) // every code on one route
	for _, code := range wire.Codes() {
		t.Run(string(code), func(t *testing.T) {
			want := wire.HTTPStatus(code)
			if want < 400 || want == http.StatusInternalServerError && code != wire.CodeInternal {
				t.Fatalf("wire.HTTPStatus(%s) = %d", code, want)
			}
			if got := statusFor(code); got != want {
				t.Errorf("statusFor(%s) = %d, table %d", code, got, want)
			}
			ce, status := controlErrorOf(&node.ControlError{Err: &wire.Error{Code: code, Message: "m"}})
			if status != want || ce.Code != code {
				t.Errorf("control error %s: %d %s, table %d", code, status, ce.Code, want)
			}
			f := newFake()
			f.err = &wire.Error{Code: code, Message: "m"}
			rec := do(t, New(f, Options{Logger: slog.New(slog.DiscardHandler)}), "GET", "/v1/leases/ls_1", "")
			wantError(t, rec, want, code, "")
		})
	}
}

// TestErrorAnswers sends node errors through a route and checks status,
// body and headers as a client sees them.
func TestErrorAnswers(t *testing.T) {
	uncheckedExchanges(t) // the node's codes on one route
	held := &wire.Error{Code: wire.CodeLeaseHeld, Message: "key k is held", Key: "k",
		Holders: []wire.HolderInfo{{Holder: "w1", LeaseID: "ls_9", RemainingMS: 1500}}}
	tests := []struct {
		name       string
		err        error
		status     int
		code       wire.Code
		retryAfter bool
		message    string // exact message, when the API replaces it
		raw        string // exact body, when it matters
	}{
		{name: "lease held with details", err: held, status: 409, code: wire.CodeLeaseHeld,
			raw: `{"error":{"code":"LEASE_HELD","message":"key k is held","key":"k","holders":[{"holder":"w1","lease_id":"ls_9","remaining_ms":1500}]}}`},
		{name: "field", err: &wire.Error{Code: wire.CodeInvalidArgument, Message: "ttl_ms too small", Field: "ttl_ms"},
			status: 400, code: wire.CodeInvalidArgument,
			raw: `{"error":{"code":"INVALID_ARGUMENT","message":"ttl_ms too small","field":"ttl_ms"}}`},
		{name: "lock delay", err: &wire.Error{Code: wire.CodeLockDelay, Message: "slot blocked", RemainingMS: 250},
			status: 409, code: wire.CodeLockDelay,
			raw: `{"error":{"code":"LOCK_DELAY","message":"slot blocked","remaining_ms":250}}`},
		{name: "wrapped", err: fmt.Errorf("renew: %w", &wire.Error{Code: wire.CodeLeaseExpired, Message: "expired"}),
			status: 409, code: wire.CodeLeaseExpired},
		{name: "no leader", err: &wire.Error{Code: wire.CodeNoLeader, Message: "no leader"},
			status: 503, code: wire.CodeNoLeader, retryAfter: true},
		{name: "unavailable", err: &wire.Error{Code: wire.CodeUnavailable, Message: "shutting down"},
			status: 503, code: wire.CodeUnavailable, retryAfter: true},
		{name: "indeterminate", err: &wire.Error{Code: wire.CodeIndeterminate, Message: "leadership lost"},
			status: 504, code: wire.CodeIndeterminate},
		{name: "unknown error", err: errors.New("bolt: /var/lib/secret-path corrupted"),
			status: 500, code: wire.CodeInternal, message: "internal error"},
		{name: "internal code", err: &wire.Error{Code: wire.CodeInternal, Message: "raft: pipeline at 10.0.0.1 broke"},
			status: 500, code: wire.CodeInternal, message: "internal error"},
		{name: "unknown code", err: &wire.Error{Code: "BOGUS", Message: "detail"},
			status: 500, code: wire.CodeInternal, message: "internal error"},
		{name: "deadline", err: context.DeadlineExceeded, status: 504, code: wire.CodeIndeterminate},
		{name: "typed nil", err: (*wire.Error)(nil), status: 500, code: wire.CodeInternal, message: "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			f.err = tt.err
			var logs bytes.Buffer
			h := New(f, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			rec := do(t, h, "GET", "/v1/leases/ls_1", "")
			if tt.raw != "" && strings.TrimSpace(rec.Body.String()) != tt.raw {
				t.Errorf("body = %s\nwant   %s", rec.Body, tt.raw)
			}
			e := wantError(t, rec, tt.status, tt.code, e0(tt.err).Field)
			if tt.message != "" && e.Message != tt.message {
				t.Errorf("message = %q, want %q", e.Message, tt.message)
			}
			if got := rec.Header().Get("Retry-After") != ""; got != tt.retryAfter {
				t.Errorf("Retry-After present = %v, want %v", got, tt.retryAfter)
			}
			if rec.Header().Get(headerIndex) != "42" {
				t.Errorf("%s = %q", headerIndex, rec.Header().Get(headerIndex))
			}
			if tt.status == 500 && !strings.Contains(logs.String(), "request failed") {
				t.Errorf("a 500 was not logged: %q", logs.String())
			}
		})
	}
}

// e0 returns the *wire.Error in err with a known code, or an empty one.
func e0(err error) *wire.Error {
	var ne *wire.Error
	if errors.As(err, &ne) && ne != nil && statusFor(ne.Code) != http.StatusInternalServerError {
		return ne
	}
	return &wire.Error{}
}

// TestErrorBodyShape checks that every error body is exactly
// {"error": {...}} with no other top-level member.
func TestErrorBodyShape(t *testing.T) {
	f := newFake()
	f.err = &wire.Error{Code: wire.CodeLeaseNotFound, Message: "no lease ls_1"}
	rec := do(t, New(f, Options{}), "GET", "/v1/leases/ls_1", "")
	var top map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &top); err != nil {
		t.Fatal(err)
	}
	if len(top) != 1 || top["error"] == nil {
		t.Fatalf("body = %s", rec.Body)
	}
	var inner map[string]any
	if err := json.Unmarshal(top["error"], &inner); err != nil {
		t.Fatal(err)
	}
	if len(inner) != 2 || inner["code"] != "LEASE_NOT_FOUND" || inner["message"] != "no lease ls_1" {
		t.Fatalf("error = %v", inner)
	}
}

// panicNode panics in GetLease.
type panicNode struct{ *fakeNode }

func (panicNode) GetLease(context.Context, string, bool) (*wire.Lease, error) {
	panic("boom at 0xdeadbeef")
}

func TestPanicIs500(t *testing.T) {
	uncheckedExchanges(t) // an INTERNAL answer, on purpose
	var logs bytes.Buffer
	h := New(panicNode{newFake()}, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rec := do(t, h, "GET", "/v1/leases/ls_1", "")
	e := wantError(t, rec, 500, wire.CodeInternal, "")
	if strings.Contains(e.Message, "boom") {
		t.Errorf("panic value leaked: %q", e.Message)
	}
	if !strings.Contains(logs.String(), "handler panic") {
		t.Errorf("panic not logged: %q", logs.String())
	}
	if rec := do(t, h, "GET", "/healthz", ""); rec.Code != 200 {
		t.Errorf("after a panic: healthz %d", rec.Code)
	}
}

// TestHeartbeatItemInternalError: a per-item INTERNAL error is answered
// generically like any other.
func TestHeartbeatItemInternalError(t *testing.T) {
	h := New(internalItemNode{newFake()}, Options{})
	rec := do(t, h, "POST", "/v1/heartbeat", `{"leases":[{"lease_id":"ls_1","token":"t"}]}`)
	if strings.Contains(rec.Body.String(), "bolt") || !strings.Contains(rec.Body.String(), `"INTERNAL"`) {
		t.Errorf("body = %s", rec.Body)
	}
}

type internalItemNode struct{ *fakeNode }

func (internalItemNode) Heartbeat(_ context.Context, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error) {
	return []wire.HeartbeatResult{{LeaseID: items[0].LeaseID,
		Error: &wire.Error{Code: wire.CodeInternal, Message: "bolt: page 7 corrupt"}}}, nil
}
