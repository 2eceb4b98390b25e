package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

func TestSnapshotRoutesFake(t *testing.T) {
	f := newFake()
	h := New(f, Options{})
	rec := do(t, h, "GET", "/v1/cluster/snapshot", "")
	if rec.Code != 200 || rec.Body.String() != fakeSnapshot {
		t.Fatalf("save: %d %q", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if rec.Header().Get(headerIndex) == "" {
		t.Errorf("no %s", headerIndex)
	}
	f.only(t, "SaveSnapshot")

	// A snapshot body is not bound by the 64 KiB limit of JSON bodies.
	f = newFake()
	big := strings.Repeat("x", 1<<20)
	rec = do(t, New(f, Options{}), "PUT", "/v1/cluster/snapshot", big)
	if rec.Code != 200 {
		t.Fatalf("restore: %d %s", rec.Code, rec.Body)
	}
	var info node.SnapshotInfo
	jsonOf(t, rec, &info)
	if info.RestoredIndex != 50 || info.Size != int64(len(big)) {
		t.Errorf("restore answered %+v", info)
	}
	if c := f.only(t, "RestoreSnapshot"); c.args[0] != int64(len(big)) {
		t.Errorf("node read %v bytes, want %d", c.args[0], len(big))
	}

	// Errors before the file starts are ordinary answers.
	f = newFake()
	f.err = &wire.Error{Code: wire.CodeNoLeader, Message: "not the leader"}
	h = New(f, Options{})
	wantError(t, do(t, h, "GET", "/v1/cluster/snapshot", ""), 503, wire.CodeNoLeader, "")
	wantError(t, do(t, h, "PUT", "/v1/cluster/snapshot", "x"), 503, wire.CodeNoLeader, "")
	wantError(t, do(t, h, "POST", "/v1/cluster/snapshot", ""), 405, wire.CodeMethodNotAllowed, "")
}

func TestSnapshotRoutesNeedAdmin(t *testing.T) {
	tokens := testTokens(t)
	for _, method := range []string{"GET", "PUT"} {
		for _, c := range []struct {
			token  string
			status int
		}{{"", 401}, {readToken, 403}, {writeToken, 403}, {adminToken, 200}} {
			f := newFake()
			var hdr []string
			if c.token != "" {
				hdr = []string{"Authorization", "Bearer " + c.token}
			}
			body := "body"
			if method == "GET" {
				body = "" // GET takes none
			}
			rec := do(t, New(f, Options{Tokens: tokens}), method, "/v1/cluster/snapshot", body, hdr...)
			if rec.Code != c.status {
				t.Errorf("%s with %q: %d %s, want %d", method, c.token, rec.Code, rec.Body, c.status)
			}
			if called := len(f.called()) > 0; called != (c.status == 200) {
				t.Errorf("%s with %q: node called = %v", method, c.token, called)
			}
		}
	}
}

// failingSaver writes part of a file, then fails.
type failingSaver struct{ *fakeNode }

func (failingSaver) SaveSnapshot(_ context.Context, w io.Writer) (*node.SnapshotInfo, error) {
	if _, err := io.WriteString(w, "LEASEHOLD-SNAPSHOT\n1\n{partial"); err != nil {
		return nil, err
	}
	return nil, errors.New("disk on fire")
}

// TestSnapshotSaveCutShort: a failure after the file started breaks the
// connection instead of ending a short file cleanly.
func TestSnapshotSaveCutShort(t *testing.T) {
	srv := httptest.NewServer(New(failingSaver{newFake()}, Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/cluster/snapshot")
	if err != nil {
		return // cut before the headers went out (the start was still buffered)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("a broken snapshot stream read as complete: %d %q", resp.StatusCode, b)
	}
}

// TestSnapshotRealNode: save over HTTP, change the state, restore over
// HTTP; a corrupted file is 400 and changes nothing.
func TestSnapshotRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.TickPeriod = 20 * time.Millisecond
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h := New(FromNode(n), Options{})
	waitFor(t, "the node to be ready", func() bool { return do(t, h, "GET", "/readyz", "").Code == 200 })

	var kept wire.Lease
	rec := do(t, h, "POST", "/v1/leases", `{"key":"jobs/1","holder":"w1","ttl_ms":30000}`)
	jsonOf(t, rec, &kept)
	var file []byte
	waitFor(t, "a snapshot", func() bool {
		rec = do(t, h, "GET", "/v1/cluster/snapshot", "")
		file = rec.Body.Bytes()
		return rec.Code == 200
	})
	info, _, err := node.ReadSnapshotFile(bytes.NewReader(file))
	if err != nil || info.Index == 0 {
		t.Fatalf("saved file: %v %+v", err, info)
	}
	rec = do(t, h, "DELETE", "/v1/leases/"+kept.LeaseID, "", "X-Lease-Token", kept.Token)
	if rec.Code != 200 {
		t.Fatalf("release: %d %s", rec.Code, rec.Body)
	}

	bad := bytes.Clone(file)
	bad[len(bad)-1] ^= 1
	wantError(t, do(t, h, "PUT", "/v1/cluster/snapshot", string(bad)), 400, wire.CodeInvalidArgument, "")
	var l wire.Lease
	jsonOf(t, do(t, h, "GET", "/v1/leases/"+kept.LeaseID, ""), &l)
	if l.State != "released" {
		t.Fatalf("a refused restore changed the state: %+v", l)
	}

	rec = do(t, h, "PUT", "/v1/cluster/snapshot", string(file))
	if rec.Code != 200 {
		t.Fatalf("restore: %d %s", rec.Code, rec.Body)
	}
	var got node.SnapshotInfo
	jsonOf(t, rec, &got)
	if got.Index != info.Index || got.RestoredIndex <= info.Index || got.State == nil || got.State.ActiveLeases != 1 {
		t.Fatalf("restore answered %+v", got)
	}
	jsonOf(t, do(t, h, "GET", "/v1/leases/"+kept.LeaseID, ""), &l)
	// It comes back (its key was free), with a new fencing token.
	if l.State != "active" || l.FencingToken <= kept.FencingToken || got.Refenced != 1 {
		t.Fatalf("after restore: %+v (restore answered %+v)", l, got)
	}
}

// TestRestoreFenceFloorParam: ?fence_floor=N reaches the node; a value that
// is not a non-negative integer is INVALID_ARGUMENT naming the field, and
// the node is not called.
func TestRestoreFenceFloorParam(t *testing.T) {
	f := newFake()
	rec := do(t, New(f, Options{}), "PUT", "/v1/cluster/snapshot?fence_floor=1234", "body")
	if rec.Code != 200 {
		t.Fatalf("restore: %d %s", rec.Code, rec.Body)
	}
	if c := f.only(t, "RestoreSnapshot"); c.args[1] != uint64(1234) {
		t.Fatalf("the node got fence floor %v, want 1234", c.args[1])
	}
	f = newFake()
	wantError(t, do(t, New(f, Options{}), "PUT", "/v1/cluster/snapshot?fence_floor=-1", "body"), 400, wire.CodeInvalidArgument, "fence_floor")
	if calls := f.called(); len(calls) != 0 {
		t.Fatalf("a bad fence floor reached the node: %+v", calls)
	}
}
