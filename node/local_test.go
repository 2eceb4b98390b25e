package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// hashReplica drives a replica the way Raft does, entry by entry.
type hashReplica struct {
	t *testing.T
	r *replica
}

func newHashReplica(t *testing.T) *hashReplica {
	return &hashReplica{t: t, r: newReplica(newHub(100), newCounters(), nil)}
}

func (h *hashReplica) apply(index uint64, c fsm.Command) {
	h.t.Helper()
	data, err := fsm.Encode(c)
	if err != nil {
		h.t.Fatal(err)
	}
	h.r.ApplyBatch([]*raft.Log{{Index: index, Type: raft.LogCommand, Data: data}})
}

// sum is the SHA-256 of the replica's snapshot encoding, computed apart
// from the code under test.
func (h *hashReplica) sum() string {
	h.t.Helper()
	h.r.mu.RLock()
	defer h.r.mu.RUnlock()
	var buf bytes.Buffer
	if _, err := h.r.f.Snapshot().WriteTo(&buf); err != nil {
		h.t.Fatal(err)
	}
	s := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(s[:])
}

// pending asks for the hash at index in the background, once the request
// is registered.
// hashAnswer is what hashAt returned.
type hashAnswer struct {
	h   *stateHash
	err error
}

func (h *hashReplica) pending(index uint64, timeout time.Duration) <-chan hashAnswer {
	h.t.Helper()
	want := h.r.hashWant.Load() + 1
	out := make(chan hashAnswer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		sh, err := h.r.hashAt(ctx, index)
		out <- hashAnswer{h: sh, err: err}
	}()
	waitFor(h.t, 5*time.Second, func() bool { return h.r.hashWant.Load() == want })
	return out
}

func recv(t *testing.T, ch <-chan hashAnswer) hashAnswer {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to a hash request within 10s")
		return hashAnswer{}
	}
}

func tickCmd(n uint64) *fsm.Tick {
	return &fsm.Tick{Tick: n, WallMS: int64(n) * 100, PeriodMS: 100, RetainTicks: 100}
}

func acquireCmd(id, key string) *fsm.Acquire {
	return &fsm.Acquire{LeaseID: id, Key: key, Holder: "h", Limit: 1, TokenHash: fsm.HashOf(id),
		TTLMS: 10000, TTLTicks: 100, WallMS: 1}
}

func TestStateHashAtIndex(t *testing.T) {
	h := newHashReplica(t)
	ctx := context.Background()
	h.apply(1, tickCmd(1))
	h.apply(2, acquireCmd("ls_a", "k/a"))
	at2 := h.sum()

	// The current index: answered at once, from the current state.
	got, err := h.r.hashAt(ctx, 2)
	if err != nil || got.sum != at2 || got.index != 2 || got.tick != 1 {
		t.Fatalf("hash at the applied index: %+v %v, want %s", got, err, at2)
	}
	// An index already passed.
	_, err = h.r.hashAt(ctx, 1)
	if e, ok := err.(*wire.Error); !ok || e.Code != wire.CodeIndexPassed || e.AppliedIndex != 2 {
		t.Fatalf("hash at a passed index: %v", err)
	}

	// Indexes 3 and 4 are entries Raft keeps to itself (a no-op, a
	// barrier): the state after them is the state after 2. Index 5 then
	// changes it.
	p3, p4, p5 := h.pending(3, 10*time.Second), h.pending(4, 10*time.Second), h.pending(5, 10*time.Second)
	h.apply(5, acquireCmd("ls_b", "k/b"))
	at5 := h.sum()
	for i, p := range []<-chan hashAnswer{p3, p4} {
		res := recv(t, p)
		if res.err != nil || res.h.sum != at2 || res.h.index != uint64(3+i) {
			t.Fatalf("hash at %d (no state change since 2): %+v %v, want %s", 3+i, res.h, res.err, at2)
		}
	}
	res := recv(t, p5)
	if res.err != nil || res.h.sum != at5 || res.h.index != 5 {
		t.Fatalf("hash at 5: %+v %v, want %s", res.h, res.err, at5)
	}
	// A different state has a different hash.
	if at5 == at2 {
		t.Fatal("a lease more, and the same hash")
	}
	if h.r.hashWant.Load() != 0 || len(h.r.hashes) != 0 {
		t.Fatalf("requests left pending: %d", h.r.hashWant.Load())
	}

	// An index not reached in time: UNAVAILABLE with the applied index,
	// and the request is withdrawn.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = h.r.hashAt(short, 1000)
	if e, ok := err.(*wire.Error); !ok || e.Code != wire.CodeUnavailable || e.AppliedIndex != 5 {
		t.Fatalf("hash at an index not reached: %v", err)
	}
	if h.r.hashWant.Load() != 0 || len(h.r.hashes) != 0 {
		t.Fatalf("a timed-out request stays pending: %d", h.r.hashWant.Load())
	}
}

// TestStateHashSnapshotJump: a snapshot installed over a pending index
// fails the request with INDEX_PASSED; one beyond the snapshot is served
// from the restored state.
func TestStateHashSnapshotJump(t *testing.T) {
	h := newHashReplica(t)
	h.apply(1, tickCmd(1))
	// The leader's state at 20.
	src := fsm.New()
	src.Apply(1, tickCmd(1))
	src.Apply(10, acquireCmd("ls_x", "k/x"))
	src.Apply(20, tickCmd(2))
	var snap bytes.Buffer
	if _, err := src.Snapshot().WriteTo(&snap); err != nil {
		t.Fatal(err)
	}
	over, beyond := h.pending(15, 10*time.Second), h.pending(22, 10*time.Second)
	if err := h.r.Restore(io.NopCloser(bytes.NewReader(snap.Bytes()))); err != nil {
		t.Fatal(err)
	}
	res := recv(t, over)
	if e, ok := res.err.(*wire.Error); !ok || e.Code != wire.CodeIndexPassed || e.AppliedIndex != 20 {
		t.Fatalf("hash at an index a snapshot jumped over: %+v %v", res.h, res.err)
	}
	restored := h.sum()
	h.apply(23, tickCmd(3))
	res = recv(t, beyond)
	if res.err != nil || res.h.sum != restored || res.h.index != 22 {
		t.Fatalf("hash at 22 (after the snapshot, before 23): %+v %v, want %s", res.h, res.err, restored)
	}
}

// TestRestoreRefusesAnOlderSnapshot: a leader's snapshot older than what
// this server applied is refused and changes nothing (installed, Raft would
// set its applied index back and look for entries this server may have
// compacted: the "log not found" panic of the bitflip scenario); one at or
// beyond it installs.
func TestRestoreRefusesAnOlderSnapshot(t *testing.T) {
	snapAt := func(upto uint64) []byte {
		src := fsm.New()
		src.Apply(1, tickCmd(1))
		src.Apply(10, acquireCmd("ls_x", "k/x"))
		if upto >= 20 {
			src.Apply(20, tickCmd(2))
		}
		if upto >= 30 {
			src.Apply(30, tickCmd(3))
		}
		var b bytes.Buffer
		if _, err := src.Snapshot().WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	h := newHashReplica(t)
	h.r.started.Store(true)
	h.apply(1, tickCmd(1))
	h.apply(10, acquireCmd("ls_x", "k/x"))
	h.apply(20, tickCmd(2))
	h.apply(25, tickCmd(3))
	before := h.sum()
	err := h.r.Restore(io.NopCloser(bytes.NewReader(snapAt(10))))
	if !errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("a snapshot at 10 over a state at 25: %v, want ErrStaleSnapshot", err)
	}
	if h.sum() != before || h.r.f.Index() != 25 || h.r.applied.Load() != 25 {
		t.Fatalf("a refused snapshot changed the state: index %d, applied %d", h.r.f.Index(), h.r.applied.Load())
	}
	if err := h.r.Restore(io.NopCloser(bytes.NewReader(snapAt(30)))); err != nil {
		t.Fatalf("a newer snapshot: %v", err)
	}
	if h.r.f.Index() != 30 {
		t.Fatalf("after a snapshot at 30: index %d", h.r.f.Index())
	}
	// At start the state is empty: any snapshot installs.
	fresh := newHashReplica(t)
	if err := fresh.r.Restore(io.NopCloser(bytes.NewReader(snapAt(10)))); err != nil || fresh.r.f.Index() != 10 {
		t.Fatalf("a snapshot at start: %v (index %d)", err, fresh.r.f.Index())
	}
}

// TestClusterStateHashAgrees: three replicas that applied the same log have
// the same hash at the same index, and a later write changes it.
func TestClusterStateHashAgrees(t *testing.T) {
	c := threeNodes(t)
	ctx := context.Background()
	l := c.leader()
	s, err := l.CreateSession(ctx, wire.SessionRequest{Holder: "w", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cam/1", "cam/2"} {
		if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: k, Holder: "w", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "cam/3", SessionID: s.SessionID, SessionToken: s.Token}); err != nil {
		t.Fatal(err)
	}
	// hashesAt asks every node for its hash at one index; passed says that
	// a node had applied it before the request arrived.
	hashesAt := func(at uint64) (_ map[string]*LocalState, passed bool) {
		t.Helper()
		type answer struct {
			id string
			st *LocalState
			e  error
		}
		ch := make(chan answer, 3)
		for _, id := range []string{"n1", "n2", "n3"} {
			n := c.node(id)
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				st, err := n.LocalState(ctx, at)
				ch <- answer{id, st, err}
			}()
		}
		out := map[string]*LocalState{}
		for range 3 {
			a := <-ch
			if wire.ErrorCode(a.e) == wire.CodeIndexPassed {
				passed = true
				continue
			}
			if a.e != nil {
				t.Fatalf("%s: hash at %d: %v", a.id, at, a.e)
			}
			out[a.id] = a.st
		}
		return out, passed
	}
	// Ticks keep coming, so an index a few entries ahead is reached soon;
	// a loaded machine may delay a request past it, so further ahead then.
	hashes := func() (uint64, map[string]*LocalState) {
		t.Helper()
		for lead := uint64(5); lead <= 5<<6; lead *= 2 {
			at := l.AppliedIndex() + lead
			if out, passed := hashesAt(at); !passed {
				return at, out
			}
		}
		t.Fatal("every node's hash at one index: always passed")
		return 0, nil
	}
	at, first := hashes()
	want := first["n1"]
	if want.HashIndex != at || len(want.StateHash) != 64 || want.HashTick == 0 {
		t.Fatalf("n1: hash %+v", want)
	}
	leaders := 0
	for id, st := range first {
		if st.StateHash != want.StateHash || st.HashIndex != at || st.HashTick != want.HashTick {
			t.Fatalf("%s: hash at %d is %s (index %d, tick %d), n1's %s (tick %d)", id, at, st.StateHash, st.HashIndex, st.HashTick, want.StateHash, want.HashTick)
		}
		if st.NodeID != id || st.AppliedIndex < at || st.Leader != l.cfg.NodeID || st.Term == 0 {
			t.Fatalf("%s: local state %+v", id, st)
		}
		if st.State == "Leader" {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d nodes report being the leader", leaders)
	}
	// A write later, the hash at a later index differs, and still agrees.
	if _, _, err := l.Acquire(ctx, wire.AcquireRequest{Key: "cam/4", Holder: "w", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	at2, second := hashes()
	if second["n1"].StateHash == want.StateHash {
		t.Fatal("a lease more, and the same hash")
	}
	for id, st := range second {
		if st.StateHash != second["n1"].StateHash || st.HashIndex != at2 {
			t.Fatalf("%s: hash at %d is %s, n1's %s", id, at2, st.StateHash, second["n1"].StateHash)
		}
	}
	// Long past the first index now.
	_, err = c.node("n2").LocalState(ctx, at)
	if e, ok := err.(*wire.Error); !ok || e.Code != wire.CodeIndexPassed || e.AppliedIndex < at2 {
		t.Fatalf("hash at a passed index: %v", err)
	}
	// Without hash_at: no hash, no waiting.
	st, err := c.node("n3").LocalState(ctx, 0)
	if err != nil || st.StateHash != "" || st.HashIndex != 0 || st.AppliedIndex < at2 || st.SnapshotsInstalled != 0 {
		t.Fatalf("local state without a hash: %+v %v", st, err)
	}
}

// TestLocalStateCountsRestore: an operator's restore on the leader counts
// as a restore, not as an install from a leader; hashes are served after it.
func TestLocalStateCountsRestore(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.GossipAddr = "127.0.0.1:0" // not the default port, which another process may hold
	n := openNode(t, cfg)
	ctx := context.Background()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "r/1", Holder: "w", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, n)
	st, err := n.LocalState(ctx, 0)
	if err != nil || st.SnapshotsRestored != 0 || st.SnapshotsInstalled != 0 {
		t.Fatalf("before the restore: %+v %v", st, err)
	}
	if _, err := n.RestoreSnapshot(ctx, bytes.NewReader(file)); err != nil {
		t.Fatal(err)
	}
	st, err = n.LocalState(ctx, 0)
	if err != nil || st.SnapshotsRestored != 1 || st.SnapshotsInstalled != 0 {
		t.Fatalf("after the restore: %+v %v", st, err)
	}
	at := n.AppliedIndex() + 3
	st, err = n.LocalState(ctx, at)
	if err != nil || st.HashIndex != at || len(st.StateHash) != 64 {
		t.Fatalf("hash after the restore: %+v %v", st, err)
	}
}

// BenchmarkStateHash: what a hash costs, by state size: the capture in the
// apply path, and the encoding and hashing outside it.
func BenchmarkStateHash(b *testing.B) {
	for _, leases := range []int{1000, 100000, 1000000} {
		b.Run(strconv.Itoa(leases), func(b *testing.B) {
			r := newReplica(newHub(100), newCounters(), nil)
			r.f.Apply(1, tickCmd(1))
			batch := &fsm.Batch{}
			index := uint64(1)
			for i := range leases {
				batch.Commands = append(batch.Commands, acquireCmd(fmt.Sprintf("ls_%08x", i), fmt.Sprintf("k/%d", i)))
				if len(batch.Commands) == fsm.MaxBatch || i == leases-1 {
					index++
					r.f.Apply(index, batch)
					r.f.TakeEvents()
					batch = &fsm.Batch{}
				}
			}
			b.Run("capture", func(b *testing.B) {
				for range b.N {
					r.capture()
				}
			})
			b.Run("hash", func(b *testing.B) {
				for range b.N {
					if _, err := r.capture().hash(index); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// TestAppliedBy: readiness waits for an entry in flight (applied while it
// waits), gives up on one that is not applied within its bound, and stops
// waiting when the node closes.
func TestAppliedBy(t *testing.T) {
	h := newHashReplica(t)
	h.apply(1, tickCmd(1))
	if !h.r.appliedBy(1, time.Millisecond, nil) {
		t.Fatal("an applied index is not applied")
	}
	done := make(chan bool)
	go func() { done <- h.r.appliedBy(2, time.Minute, nil) }()
	time.Sleep(20 * time.Millisecond) // a head start for the wait; the verdict holds if it starts late
	h.apply(2, tickCmd(2))
	if !<-done {
		t.Fatal("an entry applied while readiness waited for it was not seen")
	}
	if h.r.appliedBy(3, 20*time.Millisecond, nil) {
		t.Fatal("an entry never applied counted as applied")
	}
	stop := make(chan struct{})
	go func() { done <- h.r.appliedBy(3, time.Minute, stop) }()
	close(stop)
	if <-done {
		t.Fatal("an entry never applied counted as applied after stop")
	}
}
