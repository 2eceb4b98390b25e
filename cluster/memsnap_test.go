package cluster

import (
	"bytes"
	"io"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// TestMemSnapshotsPublishOnClose: a snapshot being written is invisible to
// List and Open (raft's in-memory store handed out a buffer still being
// written: a data race under -race and a truncated snapshot); a closed one
// reads back whole; a cancelled one leaves the previous one in place.
func TestMemSnapshotsPublishOnClose(t *testing.T) {
	m := newMemSnapshots()
	cfg := raft.Configuration{Servers: []raft.Server{{ID: "a", Address: "a"}}}
	first, err := m.Create(1, 10, 2, cfg, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	if l, _ := m.List(); len(l) != 0 {
		t.Fatalf("an unclosed snapshot is listed: %+v", l[0])
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	// A second snapshot written while readers open the first, many times.
	second, _ := m.Create(1, 20, 2, cfg, 1, nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			_, _ = second.Write(bytes.Repeat([]byte("x"), 64))
		}
	}()
	for range 200 {
		l, err := m.List()
		if err != nil || len(l) != 1 || l[0].ID != first.ID() {
			t.Fatalf("list while writing: %v %+v", err, l)
		}
		meta, rc, err := m.Open(l[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		if string(b) != "first" || meta.Size != 5 {
			t.Fatalf("read %q (size %d) while another snapshot was written", b, meta.Size)
		}
	}
	wg.Wait()
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	l, _ := m.List()
	if len(l) != 1 || l[0].Index != 20 || l[0].Size != 200*64 {
		t.Fatalf("after close: %+v", l)
	}
	if _, _, err := m.Open(first.ID()); err == nil {
		t.Fatal("the replaced snapshot still opens")
	}

	third, _ := m.Create(1, 30, 2, cfg, 1, nil)
	_, _ = third.Write([]byte("partial"))
	_ = third.Cancel()
	if l, _ := m.List(); len(l) != 1 || l[0].Index != 20 {
		t.Fatalf("a cancelled snapshot replaced the last one: %+v", l)
	}
	if _, err := m.Create(2, 40, 2, cfg, 1, nil); err == nil {
		t.Fatal("version 2 accepted")
	}
}
