package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
)

// TestStaleSnapshotRefusal: a snapshot a leader sends that is older than
// what this server applied is refused before anything of it but the
// header is decoded, comparing Raft's indexes as well as the states'.
//   - The state's last command is at 10, but this server applied Raft
//     entries up to 20 (entries the state machine keeps nothing of); a
//     snapshot of the same state taken at Raft index 15 is older. (It
//     installed: the states' indexes were equal, and Raft then looked for
//     entries after 15 that this server may have compacted.)
//   - A snapshot whose header says index 5 is refused, whatever follows
//     the header. (It was decoded whole first, and its damage reported.)
//   - A snapshot at Raft index 25 installs.
func TestStaleSnapshotRefusal(t *testing.T) {
	r := newReplica(newHub(100), newCounters(), nil)
	r.started.Store(true)
	apply := func(index uint64, c fsm.Command) {
		t.Helper()
		b, err := fsm.EncodeChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		res := r.ApplyBatch([]*raft.Log{{Index: index, Type: raft.LogCommand, Data: b}})
		if rs, ok := res[0].([]fsm.Result); !ok || rs[0].Err != nil {
			t.Fatalf("apply %d: %+v", index, res[0])
		}
	}
	snapshot := func() []byte {
		t.Helper()
		var buf bytes.Buffer
		r.mu.RLock()
		s := r.f.Snapshot()
		r.mu.RUnlock()
		if _, err := s.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	apply(5, &fsm.Member{ID: "n1", Incarnation: "a"})
	at5 := snapshot()
	apply(10, &fsm.Member{ID: "n2", Incarnation: "b"})
	at10 := snapshot()
	for i := uint64(11); i <= 20; i++ {
		r.ApplyBatch([]*raft.Log{{Index: i, Type: raft.LogConfiguration}})
	}
	if got := r.applied.Load(); got != 20 {
		t.Fatalf("applied %d, want 20", got)
	}
	restore := func(b []byte) error { return r.Restore(io.NopCloser(bytes.NewReader(b))) }

	r.snapshotOpened(raft.SnapshotMeta{Index: 15})
	if err := restore(at10); !errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("a snapshot at Raft index 15 on a server that applied 20: %v, want refused as stale", err)
	}

	hdr := len("LHSNAP") + 1 + int(at5[len("LHSNAP")])
	damaged := append(append([]byte(nil), at5[:hdr]...), bytes.Repeat([]byte{0xff}, 64)...)
	r.snapshotOpened(raft.SnapshotMeta{Index: 6})
	if err := restore(damaged); !errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("a snapshot whose header says index 5 on a state at 10: %v, want refused as stale before the rest is decoded", err)
	}

	r.snapshotOpened(raft.SnapshotMeta{Index: 25})
	if err := restore(at10); err != nil {
		t.Fatalf("a snapshot at Raft index 25: %v", err)
	}
	if got := r.applied.Load(); got != 20 {
		t.Fatalf("applied %d after installing, want 20", got)
	}
}

// TestStopMessageNewerEntry: a committed entry of a type this release
// does not know stops the server with advice to upgrade its binary, not
// to wipe it (wiped, it would rejoin and stop at the same entry); a
// damaged entry keeps the advice to wipe or restore. Later commands are
// refused either way.
func TestStopMessageNewerEntry(t *testing.T) {
	const upgrade, wipe = "written by a newer release: upgrade this server's binary", "wipe its data directory and let it rejoin"
	entry := func(typ byte) []byte {
		b, err := fsm.EncodeChecked(&fsm.CancelWait{LeaseID: "x", Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		b[1] = typ
		// The checksum is of every byte before it: recompute it.
		return binary.LittleEndian.AppendUint32(b[:len(b)-4], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	}
	rotten := entry(byte(fsm.TypeCancelWait))
	rotten[3] ^= 1
	for _, tc := range []struct {
		name      string
		data      []byte
		is        error
		want, not string
	}{
		{"newer type", entry(0xff), fsm.ErrUnknownType, upgrade, wipe},
		{"damaged", rotten, fsm.ErrChecksum, wipe, upgrade},
	} {
		r := newReplica(newHub(100), newCounters(), nil)
		var stopErr error
		r.corrupt = func(index uint64, err error) { stopErr = err }
		res := r.ApplyBatch([]*raft.Log{{Index: 7, Type: raft.LogCommand, Data: tc.data}})
		rs, ok := res[0].([]fsm.Result)
		if !ok || rs[0].Err == nil {
			t.Fatalf("%s: applied: %+v", tc.name, res[0])
		}
		msg := rs[0].Err.Error()
		if !errors.Is(stopErr, tc.is) || !strings.Contains(msg, "committed log entry 7") ||
			!strings.Contains(msg, tc.want) || strings.Contains(msg, tc.not) {
			t.Errorf("%s: stopped with %v: %q; want %q and not %q", tc.name, stopErr, msg, tc.want, tc.not)
		}
		if b := r.broken.Load(); b == nil || !strings.Contains(msg, *b) {
			t.Errorf("%s: broken = %v, want the message", tc.name, b)
		}
		later := r.ApplyBatch([]*raft.Log{{Index: 8, Type: raft.LogCommand, Data: entry(byte(fsm.TypeCancelWait))}})
		if rs, ok := later[0].([]fsm.Result); !ok || rs[0].Err == nil {
			t.Errorf("%s: a later command applied: %+v", tc.name, later[0])
		}
	}
}
