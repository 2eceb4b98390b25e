package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeNode is a Node that records every call and answers with canned values.
type fakeNode struct {
	mu       sync.Mutex
	calls    []call
	err      error // returned by every operation when set
	replayed bool
	readyErr error
	stats    node.Stats
	sub      *fakeSub
	index    atomic.Uint64
}

// call is one recorded call: the method and its arguments.
type call struct {
	method string
	args   []any
}

func newFake() *fakeNode {
	f := &fakeNode{sub: newFakeSub()}
	f.index.Store(42)
	return f
}

func (f *fakeNode) record(method string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{method, args})
	return f.err
}

// called returns the recorded calls.
func (f *fakeNode) called() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// only returns the one recorded call, failing the test unless there is
// exactly one and it is of method.
func (f *fakeNode) only(t *testing.T, method string) call {
	t.Helper()
	cs := f.called()
	if len(cs) != 1 || cs[0].method != method {
		t.Fatalf("calls = %v, want one %s", cs, method)
	}
	return cs[0]
}

func testLease(id string) *wire.Lease {
	return &wire.Lease{LeaseID: id, Key: "k", Holder: "h", Limit: 1, State: "active",
		FencingToken: 7, TTLMS: 10000, RemainingMS: 9000, ExpiresAt: time.Unix(1e9, 0).UTC()}
}

func testSession(id string) *wire.Session {
	return &wire.Session{SessionID: id, Holder: "h", State: "active", TTLMS: 10000, LeaseIDs: []string{}}
}

func (f *fakeNode) Acquire(_ context.Context, req wire.AcquireRequest) (*wire.Lease, bool, error) {
	if err := f.record("Acquire", req); err != nil {
		return nil, false, err
	}
	l := testLease("ls_1")
	l.Key, l.Holder, l.Token = req.Key, req.Holder, "lease-secret"
	return l, f.replayed, nil
}

func (f *fakeNode) GetLease(_ context.Context, id string, stale bool) (*wire.Lease, error) {
	if err := f.record("GetLease", id, stale); err != nil {
		return nil, err
	}
	return testLease(id), nil
}

func (f *fakeNode) ListLeases(_ context.Context, req wire.ListRequest, stale bool) (*wire.LeaseList, error) {
	if err := f.record("ListLeases", req, stale); err != nil {
		return nil, err
	}
	if req.Key == "none" {
		return &wire.LeaseList{}, nil
	}
	return &wire.LeaseList{Leases: []*wire.Lease{testLease("ls_1")}, Next: "ls_1"}, nil
}

func (f *fakeNode) Renew(_ context.Context, req wire.RenewRequest) (*wire.Lease, error) {
	if err := f.record("Renew", req); err != nil {
		return nil, err
	}
	return testLease(req.LeaseID), nil
}

// RenewMany records one call and answers each request as Renew does; a
// token "bad" is refused (LEASE_TOKEN_INVALID).
func (f *fakeNode) RenewMany(_ context.Context, reqs []wire.RenewRequest, out []node.Renewed) {
	err := f.record("RenewMany", append([]wire.RenewRequest(nil), reqs...))
	for i, r := range reqs {
		switch {
		case err != nil:
			out[i] = node.Renewed{Err: err}
		case r.Token == "bad":
			out[i] = node.Renewed{Err: &wire.Error{Code: wire.CodeLeaseTokenInvalid, Message: "wrong token"}}
		default:
			out[i] = node.Renewed{Lease: testLease(r.LeaseID)}
		}
	}
}

func (f *fakeNode) Release(_ context.Context, req wire.ReleaseRequest) (*wire.Lease, error) {
	if err := f.record("Release", req); err != nil {
		return nil, err
	}
	l := testLease(req.LeaseID)
	l.State, l.EndReason = "released", req.Reason
	return l, nil
}

func (f *fakeNode) Revoke(_ context.Context, id, reason string) (*wire.Lease, error) {
	if err := f.record("Revoke", id, reason); err != nil {
		return nil, err
	}
	l := testLease(id)
	l.State, l.EndReason = "revoked", reason
	return l, nil
}

func (f *fakeNode) Heartbeat(_ context.Context, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error) {
	if err := f.record("Heartbeat", items); err != nil {
		return nil, err
	}
	var out []wire.HeartbeatResult
	for _, it := range items {
		if it.Token == "bad" {
			out = append(out, wire.HeartbeatResult{LeaseID: it.LeaseID,
				Error: &wire.Error{Code: wire.CodeLeaseTokenInvalid, Message: "wrong token"}})
			continue
		}
		out = append(out, wire.HeartbeatResult{LeaseID: it.LeaseID, OK: true, FencingToken: testLease(it.LeaseID).FencingToken, RemainingMS: 1000})
	}
	return out, nil
}

func (f *fakeNode) CreateSession(_ context.Context, req wire.SessionRequest) (*wire.Session, error) {
	if err := f.record("CreateSession", req); err != nil {
		return nil, err
	}
	s := testSession("ss_1")
	s.Holder, s.TTLMS, s.Token = req.Holder, req.TTLMS, "session-secret"
	return s, nil
}

func (f *fakeNode) GetSession(_ context.Context, id string, stale bool) (*wire.Session, error) {
	if err := f.record("GetSession", id, stale); err != nil {
		return nil, err
	}
	return testSession(id), nil
}

func (f *fakeNode) ListSessions(_ context.Context, holder, after string, limit int, stale bool) (*wire.SessionList, error) {
	if err := f.record("ListSessions", holder, after, limit, stale); err != nil {
		return nil, err
	}
	if holder == "none" {
		return &wire.SessionList{}, nil
	}
	return &wire.SessionList{Sessions: []*wire.Session{testSession("ss_1")}}, nil
}

func (f *fakeNode) SessionHeartbeat(_ context.Context, req wire.SessionHeartbeatRequest) (*wire.Session, error) {
	args := []any{req.SessionID, req.Token}
	if req.Metadata != nil {
		args = append(args, req.Metadata)
	}
	if err := f.record("SessionHeartbeat", args...); err != nil {
		return nil, err
	}
	s := testSession(req.SessionID)
	if req.Metadata != nil {
		s.Metadata = req.Metadata
	}
	return s, nil
}

func (f *fakeNode) EndSession(_ context.Context, id, token string, force bool) (*wire.Session, error) {
	if err := f.record("EndSession", id, token, force); err != nil {
		return nil, err
	}
	s := testSession(id)
	s.State = "ended"
	return s, nil
}

func (f *fakeNode) ReleaseHolder(_ context.Context, holder, reason string) (int, error) {
	if err := f.record("ReleaseHolder", holder, reason); err != nil {
		return 0, err
	}
	return 3, nil
}

func (f *fakeNode) Validate(_ context.Context, req wire.ValidateRequest) (*wire.ValidateResult, error) {
	if err := f.record("Validate", req); err != nil {
		return nil, err
	}
	return &wire.ValidateResult{Valid: true, Reason: "active", Current: testLease("ls_1")}, nil
}

func (f *fakeNode) Subscribe(_ context.Context, filter wire.EventFilter) (Subscription, error) {
	if err := f.record("Subscribe", filter); err != nil {
		return nil, err
	}
	return f.sub, nil
}

func (f *fakeNode) ClusterStatus(context.Context, bool) (*wire.ClusterStatus, error) {
	if err := f.record("ClusterStatus"); err != nil {
		return nil, err
	}
	return &wire.ClusterStatus{NodeID: "n1", Leader: "n1", Members: []wire.Member{{ID: "n1", Voter: true, Leader: true}}}, nil
}

func (f *fakeNode) RemoveMember(_ context.Context, id string) error {
	return f.record("RemoveMember", id)
}

func (f *fakeNode) TransferLeadership(_ context.Context, id string) error {
	return f.record("TransferLeadership", id)
}

// SaveSnapshot writes fakeSnapshot.
func (f *fakeNode) SaveSnapshot(_ context.Context, w io.Writer) (*node.SnapshotInfo, error) {
	if err := f.record("SaveSnapshot"); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(w, fakeSnapshot); err != nil {
		return nil, err
	}
	return &node.SnapshotInfo{Format: 1, Index: 9, Size: int64(len(fakeSnapshot))}, nil
}

// RestoreSnapshotWith reads the whole body and records its length and
// fence floor.
func (f *fakeNode) RestoreSnapshotWith(_ context.Context, r io.Reader, opts wire.RestoreOptions) (*node.SnapshotInfo, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, err
	}
	if err := f.record("RestoreSnapshot", n, opts.FenceFloor); err != nil {
		return nil, err
	}
	return &node.SnapshotInfo{Format: 1, Index: 9, Size: n, RestoredIndex: 50}, nil
}

const fakeSnapshot = "LEASEHOLD-SNAPSHOT\nfake\n"

// LocalState records hashAt and how long the context leaves.
func (f *fakeNode) LocalState(ctx context.Context, hashAt uint64) (*node.LocalState, error) {
	var left time.Duration
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	if err := f.record("LocalState", hashAt, left); err != nil {
		return nil, err
	}
	st := &node.LocalState{NodeID: "n1", State: "Follower", AppliedIndex: f.index.Load()}
	if hashAt > 0 {
		st.StateHash, st.HashIndex, st.HashTick = strings.Repeat("ab", 32), hashAt, 3
	}
	return st, nil
}

func (f *fakeNode) ReadyErr() error      { return f.readyErr }
func (f *fakeNode) AppliedIndex() uint64 { return f.index.Load() }
func (f *fakeNode) Stats() node.Stats    { return f.stats }

// The fake is a node on its own: it knows no leader (so it answers every
// request itself; followerFake forwards), its log is healthy, and it has
// no registry and no control lease.
func (f *fakeNode) Leader() (node.LeaderInfo, bool) { return node.LeaderInfo{}, false }
func (f *fakeNode) NodeID() string                  { return "n1" }
func (f *fakeNode) HealthErr() error                { return nil }
func (f *fakeNode) Registry() *prometheus.Registry  { return nil }
func (f *fakeNode) ControlLease() ControlNode       { return nil }

// fakeSub is a Subscription fed by the test.
type fakeSub struct {
	ch        chan wire.Event
	err       atomic.Pointer[error]
	closeOnce sync.Once
	closed    chan struct{}
}

func newFakeSub() *fakeSub {
	return &fakeSub{ch: make(chan wire.Event, 16), closed: make(chan struct{})}
}

func (s *fakeSub) Events() <-chan wire.Event { return s.ch }

func (s *fakeSub) Err() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *fakeSub) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// end ends the subscription from the node's side with err.
func (s *fakeSub) end(err error) {
	if err != nil {
		s.err.Store(&err)
	}
	close(s.ch)
}

// do sends one request to h. hdr lists header name, value pairs.
func do(t *testing.T, h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// errorOf decodes an error answer, failing the test if it is not one.
func errorOf(t *testing.T, rec *httptest.ResponseRecorder) *wire.Error {
	t.Helper()
	var body struct {
		Error *wire.Error `json:"error"`
	}
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Error == nil {
		t.Fatalf("not an error body (%v): status %d", err, rec.Code)
	}
	return body.Error
}

// wantError checks an error answer's status, code and field.
func wantError(t *testing.T, rec *httptest.ResponseRecorder, status int, code wire.Code, field string) *wire.Error {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	e := errorOf(t, rec)
	if e.Code != code || e.Field != field {
		t.Fatalf("error = %+v, want code %s field %q", e, code, field)
	}
	if e.Message == "" {
		t.Fatalf("error %s has no message", e.Code)
	}
	return e
}

// jsonOf decodes a JSON answer into v.
func jsonOf(t *testing.T, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("decode %s: %v", rec.Body, err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	for !cond() {
		select {
		case <-poll.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitClosed waits for ch to be closed or the deadline to pass.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
