package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// testSnapshotFile builds a snapshot file around body (the client checks
// size and checksum, not the state inside).
func testSnapshotFile(body string) []byte {
	sum := sha256.Sum256([]byte(body))
	return fmt.Appendf(nil, "LEASEHOLD-SNAPSHOT\n1\n{\"index\":77,\"term\":3,\"created_at\":\"2026-01-02T03:04:05Z\",\"node_id\":\"n1\",\"size\":%d,\"sha256\":%q}\n%s",
		len(body), hex.EncodeToString(sum[:]), body)
}

func TestSaveSnapshot(t *testing.T) {
	file := testSnapshotFile(strings.Repeat("state", 30000))
	down, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 503, wire.CodeNoLeader, "no leader")
	})
	up, hits := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.URL.Path != "/v1/cluster/snapshot" || r.Header.Get("Authorization") != "Bearer bearer-secret" {
			t.Errorf("request %s %s auth %q", r.Method, r.URL, r.Header.Get("Authorization"))
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(file)
	})
	c := newClient(t, down.URL, up.URL)
	var buf bytes.Buffer
	info, err := c.SaveSnapshot(context.Background(), &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), file) || info.Index != 77 || info.Term != 3 || info.Size != 150000 || hits.n.Load() != 1 {
		t.Fatalf("saved %d bytes, info %+v", buf.Len(), info)
	}

	for name, bad := range map[string][]byte{
		"truncated":  file[:len(file)-1],
		"corrupted":  append(bytes.Clone(file[:len(file)-1]), 'x'),
		"not a file": []byte(`{"error":"nope"}`),
	} {
		s, _ := server(t, func(w http.ResponseWriter, r *http.Request) { w.Write(bad) })
		if _, err := newClient(t, s.URL).SaveSnapshot(context.Background(), io.Discard); err == nil ||
			!strings.Contains(err.Error(), "incomplete or corrupted") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRestoreSnapshot(t *testing.T) {
	file := testSnapshotFile("state")
	ok, hits := server(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != "PUT" || r.URL.Path != "/v1/cluster/snapshot" || !bytes.Equal(body, file) ||
			r.Header.Get("Content-Type") != "application/octet-stream" || r.Header.Get("Authorization") != "Bearer bearer-secret" {
			t.Errorf("request %s %s %q %v", r.Method, r.URL, body, r.Header)
		}
		writeJSON(w, 200, wire.SnapshotInfo{Format: 1, Index: 77, RestoredIndex: 500})
	})
	// A node that cannot be reached at all: the restore moves on.
	c := newClient(t, refusedAddr(t), ok.URL)
	info, err := c.RestoreSnapshot(context.Background(), bytes.NewReader(file))
	if err != nil || info.RestoredIndex != 500 || hits.n.Load() != 1 {
		t.Fatalf("restore: %v %+v (hits %d)", err, info, hits.n.Load())
	}

	// A node that answered: never sent again elsewhere.
	busy, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeErr(w, 503, wire.CodeNoLeader, "no leader")
	})
	ok2, hits2 := server(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, wire.SnapshotInfo{}) })
	_, err = newClient(t, busy.URL, ok2.URL).RestoreSnapshot(context.Background(), bytes.NewReader(file))
	if ErrorCode(err) != wire.CodeNoLeader || hits2.n.Load() != 0 {
		t.Fatalf("restore after a 503: %v, other node hit %d times", err, hits2.n.Load())
	}
	bad, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 400, wire.CodeInvalidArgument, "invalid snapshot file: checksum mismatch")
	})
	if _, err := newClient(t, bad.URL).RestoreSnapshot(context.Background(), strings.NewReader("x")); ErrorCode(err) != wire.CodeInvalidArgument {
		t.Fatalf("bad file: %v", err)
	}
}

// TestRestoreSnapshotFenceFloor: RestoreSnapshotWith sends the fence floor
// as ?fence_floor=N; without one, no query.
func TestRestoreSnapshotFenceFloor(t *testing.T) {
	file := testSnapshotFile("state")
	var got []string
	var mu sync.Mutex
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.URL.RawQuery)
		mu.Unlock()
		writeJSON(w, 200, wire.SnapshotInfo{Format: 1})
	})
	c := newClient(t, s.URL)
	if _, err := c.RestoreSnapshotWith(context.Background(), bytes.NewReader(file), wire.RestoreOptions{FenceFloor: 9876}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RestoreSnapshot(context.Background(), bytes.NewReader(file)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "fence_floor=9876" || got[1] != "" {
		t.Fatalf("queries sent: %q", got)
	}
}
