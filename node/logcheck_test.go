package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// rotLogs stands for a disk that rotted under the log store: every
// checksummed command entry up to index upTo reads back with one bit
// flipped (0: none).
type rotLogs struct {
	raft.LogStore
	upTo *atomic.Uint64
}

func (s rotLogs) GetLog(index uint64, l *raft.Log) error {
	if err := s.LogStore.GetLog(index, l); err != nil {
		return err
	}
	if index <= s.upTo.Load() && l.Type == raft.LogCommand && len(l.Data) > 8 && l.Data[0] == fsm.VersionChecked {
		d := append([]byte(nil), l.Data...)
		d[len(d)/2] ^= 0x10
		l.Data = d
	}
	return nil
}

// TestBitRotOnLeaderNotReplicated: entries that rotted on the leader's
// disk after it applied them never reach a server that catches up from
// it (which would stop on them): the leader refuses them, takes a fresh
// snapshot, and the new server starts from that and serves the cluster's
// state.
func TestBitRotOnLeaderNotReplicated(t *testing.T) {
	c := newTestCluster(t)
	var rotted atomic.Uint64
	cfg1 := clusterConfig("n1")
	cfg1.WrapRaftStores = func(logs raft.LogStore, st raft.StableStore) (raft.LogStore, raft.StableStore) {
		return rotLogs{LogStore: logs, upTo: &rotted}, st
	}
	n1 := c.start(cfg1)
	<-n1.Ready()
	ctx := context.Background()
	const leases = 40
	for i := range leases {
		if _, _, err := n1.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("rot/%d", i), Holder: "w", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
	}
	rotted.Store(n1.AppliedIndex())
	cfg2 := clusterConfig("n2")
	cfg2.Join = []string{n1.mem.Gossip().Addr()}
	n2 := c.start(cfg2)
	waitFor(t, 45*time.Second, func() bool {
		if msg := n2.rep.broken.Load(); msg != nil {
			t.Fatalf("the new server stopped on an entry from the leader's damaged disk: %s", *msg)
		}
		return n2.ReadyErr() == nil && n2.AppliedIndex() >= rotted.Load()
	})
	list, err := n2.ListLeases(ctx, wire.ListRequest{Prefix: "rot/", Limit: 100}, true)
	if err != nil || len(list.Leases) != leases {
		t.Fatalf("the new server's leases: %v, %+v", err, list)
	}
	if got := metricValue(t, n1.rot.refused); got < 1 {
		t.Fatalf("leasehold_log_entries_damaged_total = %v, want >= 1", got)
	}
}

// TestEntryTypeRotStopsServer: five committed command entries of a single
// server's log turn into no-ops on its disk while it is stopped (one bit of
// each entry's type). Raft never hands a no-op to the state machine, and
// the command checksum covers only the command's bytes: the five commands
// were gone without a word and the server served. It must stop at the
// first of them instead, naming the entry, and report not ready. Both log
// stores: raft.db (msgpack) and raft-wal segments (varints).
func TestEntryTypeRotStopsServer(t *testing.T) {
	for _, kind := range []string{cluster.LogStoreBoltDB, cluster.LogStoreWAL} {
		t.Run(kind, func(t *testing.T) { entryTypeRot(t, kind) })
	}
}

func entryTypeRot(t *testing.T, kind string) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.RaftLog = kind
	n := openNode(t, cfg)
	waitFor(t, 5*time.Second, n.gc.crcOK.Load)
	ctx := context.Background()
	for i := range 20 {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("typerot-marker-%04d", i), Holder: "w", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()

	for i := 5; i < 10; i++ {
		if flipped := flipEntryType(t, dir, kind, []byte(fmt.Sprintf("typerot-marker-%04d", i))); flipped == 0 {
			t.Fatalf("the entry of lease %d is in no file of the data directory", i)
		}
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
	if !errors.Is(badErr, ErrEntryFraming) {
		t.Fatalf("entry %d: %v, want a damaged entry type", badIndex, badErr)
	}
	if err := n2.ReadyErr(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("entry %d ", badIndex)) {
		t.Fatalf("ready after a damaged entry: %v", err)
	}
	t.Logf("stopped: %v", n2.ReadyErr())
}

// flipEntryType turns the command entry whose data holds marker into a
// no-op (type 0 -> 1, one bit) in every file of the data directory that
// holds it, and returns how many places it changed.
func flipEntryType(t *testing.T, dir, kind string, marker []byte) int {
	t.Helper()
	flipped := 0
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (kind == cluster.LogStoreWAL) != strings.HasSuffix(path, ".wal") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		changed := false
		for off := 0; ; {
			i := bytes.Index(b[off:], marker)
			if i < 0 {
				break
			}
			at := off + i
			off = at + len(marker)
			if p := typeByteOf(b, at, kind); p >= 0 {
				b[p] ^= 0x01 // raft.LogCommand -> raft.LogNoop
				changed = true
				flipped++
			}
		}
		if changed {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	})
	return flipped
}

// typeByteOf finds the type byte (raft.LogCommand, 0) of the entry whose
// data holds the byte at, or -1. raft.db keeps an entry as a msgpack map
// with sorted keys (AppendedAt, Data, Extensions, Index, Term, Type: 0),
// raft-wal as varints (index, term, type, data length, data).
func typeByteOf(b []byte, at int, kind string) int {
	if kind != cluster.LogStoreWAL {
		key := []byte("\xa4Type\x00")
		if i := bytes.Index(b[at:min(len(b), at+512)], key); i >= 0 {
			return at + i + len(key) - 1
		}
		return -1
	}
	for p := at - 1; p >= max(0, at-64); p-- {
		if b[p] != 0 {
			continue
		}
		l, w := binary.Uvarint(b[p+1:])
		start := p + 1 + w
		if w > 0 && start < at && b[start] == fsm.VersionChecked && start+int(l) > at && int(l) < 1024 {
			return p
		}
	}
	return -1
}

// TestEntryFraming: what the log check makes of an entry's index and type.
func TestEntryFraming(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   uint64
		l    raft.Log
		bad  bool
	}{
		{"command", 7, raft.Log{Index: 7, Type: raft.LogCommand, Data: []byte{5, 1}}, false},
		{"configuration", 7, raft.Log{Index: 7, Type: raft.LogConfiguration, Data: []byte{1}}, false},
		{"no-op", 7, raft.Log{Index: 7, Type: raft.LogNoop}, false},
		{"barrier", 7, raft.Log{Index: 7, Type: raft.LogBarrier}, false},
		{"no-op with data", 7, raft.Log{Index: 7, Type: raft.LogNoop, Data: []byte{5, 1}}, true},
		{"barrier with data", 7, raft.Log{Index: 7, Type: raft.LogBarrier, Data: []byte{5, 1}}, true},
		{"deprecated with data", 7, raft.Log{Index: 7, Type: raft.LogAddPeerDeprecated, Data: []byte{5, 1}}, true},
		{"unknown type", 7, raft.Log{Index: 7, Type: raft.LogType(16)}, true},
		{"other index", 7, raft.Log{Index: 6, Type: raft.LogCommand, Data: []byte{5, 1}}, true},
	} {
		err := entryFraming(tc.at, &tc.l)
		if (err != nil) != tc.bad || err != nil && !errors.Is(err, ErrEntryFraming) {
			t.Errorf("%s: %v, want damaged %v", tc.name, err, tc.bad)
		}
	}
}
