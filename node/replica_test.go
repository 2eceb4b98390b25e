package node

import (
	"bytes"
	"errors"
	"io"
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
