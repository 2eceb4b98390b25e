package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// TestBitRotInCommittedEntries: leases are written, the server stops, and
// one byte of the command data of a committed entry after the last
// snapshot is flipped in the log store's files. On restart the server
// refuses to apply that entry (a checksum mismatch naming its index) and
// reports not ready with the reason, instead of replaying a different
// command than the one the cluster committed. (Before entries carried a
// checksum, the flipped key was applied without a word.)
// Both log stores: raft.db (bbolt checksums no data page) and raft-wal
// segments.
func TestBitRotInCommittedEntries(t *testing.T) {
	for _, kind := range []string{cluster.LogStoreBoltDB, cluster.LogStoreWAL} {
		t.Run(kind, func(t *testing.T) { bitRot(t, kind) })
	}
}

func bitRot(t *testing.T, kind string) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.RaftLog = kind
	n := openNode(t, cfg)
	waitFor(t, 5*time.Second, n.gc.crcOK.Load)
	ctx := context.Background()
	for i := range 20 {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("bitrot-marker-%04d", i), Holder: "w", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()

	// Flip one byte of the key of the tenth lease, wherever the log store
	// keeps it (raft.db, or raft-wal segments).
	marker := []byte("bitrot-marker-0009")
	flipped := 0
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || kind == cluster.LogStoreWAL && filepath.Base(path) == "raft.db" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		// Every copy: bbolt leaves earlier versions of a page in its
		// free pages.
		found := false
		for off := 0; ; {
			i := bytes.Index(b[off:], marker)
			if i < 0 {
				break
			}
			b[off+i+len(marker)-1] ^= 0x01 // ...0009 -> ...0008
			off += i + len(marker)
			found = true
		}
		if found {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			flipped++
		}
		return nil
	})
	if flipped == 0 {
		t.Fatal("the marker is in no file of the data directory")
	}

	var mu sync.Mutex
	var badIndex uint64
	var badErr error
	cfg2 := cfg
	cfg2.corruptEntry = func(index uint64, err error) {
		mu.Lock()
		defer mu.Unlock()
		if badIndex == 0 {
			badIndex, badErr = index, err
		}
	}
	n2, err := Open(cfg2)
	if err != nil {
		t.Logf("open refused: %v", err)
		return // refusing to open at all is loud too
	}
	defer n2.Close()
	waitFor(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return badIndex != 0
	})
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(badErr, fsm.ErrChecksum) {
		t.Fatalf("entry %d: %v, want a checksum mismatch", badIndex, badErr)
	}
	if err := n2.ReadyErr(); err == nil || !bytes.Contains([]byte(err.Error()), []byte(fmt.Sprint(badIndex))) {
		t.Fatalf("ready after a damaged entry: %v", err)
	}
}

// TestBitRotInSnapshotFile: one byte of the state in the server's only
// Raft snapshot file is flipped while it is stopped. On restart Raft's
// CRC refuses the snapshot, and the server does not start on a state it
// cannot trust: Open fails saying so (or, had an older snapshot been
// there, it would have fallen back to it).
func TestBitRotInSnapshotFile(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	n := openNode(t, cfg)
	ctx := context.Background()
	for i := range 20 {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("snap-marker-%04d", i), Holder: "w", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.bk.raftSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	n.Close()
	states, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if len(states) == 0 {
		t.Fatal("no snapshot file")
	}
	flipped := 0
	for _, p := range states {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte("snap-marker-0007")); i >= 0 {
			b[i+len("snap-marker-0007")-1] ^= 0x01
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			flipped++
		}
	}
	if flipped == 0 {
		t.Fatal("the marker is in no snapshot file")
	}
	n2, err := Open(cfg)
	if err == nil {
		defer n2.Close()
		// Started: it must not have taken the damaged state. Every lease
		// is as written (an older snapshot or the log covered it).
		waitFor(t, 10*time.Second, func() bool { return n2.ReadyErr() == nil })
		list, err := n2.ListLeases(ctx, wire.ListRequest{Prefix: "snap-marker-", State: "active"}, true)
		if err != nil || len(list.Leases) != 20 {
			t.Fatalf("started on a damaged snapshot: %v %+v", err, list)
		}
		for _, l := range list.Leases {
			if l.Key == "snap-marker-0006" && l.Holder != "w" {
				t.Fatalf("damaged lease served: %+v", l)
			}
		}
		return
	}
	if !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("refused, but not saying why: %v", err)
	}
	t.Logf("refused: %v", err)
}
