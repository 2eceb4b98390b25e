package node

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// startStorm subscribes to storm/ events, then acquires n leases on
// storm/0..n-1 with a TTL of 1.5 s: every one bound to a session that is
// never heartbeaten if bound, else every other one.
func startStorm(t *testing.T, n0 *Node, n int, bound bool) (*Subscription, *wire.Session) {
	t.Helper()
	ctx := context.Background()
	sub, err := n0.Subscribe(ctx, wire.EventFilter{Prefix: "storm/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	sess, err := n0.CreateSession(ctx, wire.SessionRequest{Holder: "s", TTLMS: 1500})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		r := wire.AcquireRequest{Key: fmt.Sprint("storm/", i), Holder: "s", TTLMS: 1500}
		if bound || i%2 == 1 {
			r.TTLMS, r.SessionID, r.SessionToken = 0, sess.SessionID, sess.Token
		}
		if _, _, err := n0.Acquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	return sub, sess
}

// awaitExpired reads sub until n expired events have come, passing each to
// seen (if not nil); it fails after a minute.
func awaitExpired(t *testing.T, sub *Subscription, n int, seen func(wire.Event)) {
	t.Helper()
	expired := 0
	deadline := time.After(60 * time.Second)
	for expired < n {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			if ev.Type == "expired" {
				expired++
				if seen != nil {
					seen(ev)
				}
			}
		case <-deadline:
			t.Fatalf("%d of %d leases expired", expired, n)
		}
	}
}

// TestExpiryStormChunked: a storm larger than one chunk (standalone leases
// and leases bound to a session that is never heartbeaten, all ending
// together) ends completely, in several entries of at most a chunk each,
// which the tick loop proposes without waiting for the next tick.
func TestExpiryStormChunked(t *testing.T) {
	const n, chunk = 150, 20
	cfg := testConfig(t, "")
	cfg.expireChunk = chunk
	n0 := openNode(t, cfg)
	ctx := context.Background()
	sub, sess := startStorm(t, n0, n, false)
	perIndex := map[uint64]int{}
	boundAt := map[uint64]bool{} // entries that ended a session-bound lease
	awaitExpired(t, sub, n, func(ev wire.Event) {
		perIndex[ev.Index]++
		var i int
		if _, err := fmt.Sscanf(ev.Key, "storm/%d", &i); err == nil && i%2 == 1 {
			boundAt[ev.Index] = true
		}
	})
	for idx, c := range perIndex {
		if c > chunk {
			t.Fatalf("entry %d expired %d leases, chunk is %d", idx, c, chunk)
		}
	}
	// The session's leases (every odd key) all end when it does, however
	// long the acquires took: more than a chunk, so in several entries of
	// at most a chunk each. (The standalone leases end at as many ticks as
	// the acquires spanned, a few at each on a slow machine.)
	bound := n / 2
	if len(boundAt) < (bound+chunk-1)/chunk {
		t.Fatalf("the session's %d leases ended in %d entries, want at least %d (chunk %d)", bound, len(boundAt), (bound+chunk-1)/chunk, chunk)
	}
	if _, err := n0.SessionHeartbeat(ctx, sess.SessionID, sess.Token); wire.ErrorCode(err) != wire.CodeSessionEnded {
		t.Fatalf("heartbeat after the storm: %v", err)
	}
}

// TestChunkedExpiryWaitsForEveryServer: ticks are limited (new entry
// types) only once every other server of the configuration reads them
// (which servers announce it: cluster's TestEveryPeer).
func TestChunkedExpiryWaitsForEveryServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.expireChunk = 20
	cfg.olderPeer = true // nothing recorded in the state (features.go): chunkedOK alone decides
	n0 := openNode(t, cfg)
	if n0.tk.chunkedOK.Store(false); n0.tk.tickChunk() != 0 {
		t.Fatalf("tick chunk %d before every server reads limited ticks, want 0 (an unlimited tick)", n0.tk.tickChunk())
	}
	if n0.tk.chunkedOK.Store(true); n0.tk.tickChunk() != 20 {
		t.Fatalf("tick chunk %d once every server reads limited ticks, want 20", n0.tk.tickChunk())
	}
}

// TestChunkedPruneWaitsForEveryServer: ticks carry a prune limit (a new
// entry type) only once every other server of the configuration reads
// them, and only with an expiry limit, which that type carries too.
func TestChunkedPruneWaitsForEveryServer(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.expireChunk = 20
	cfg.olderPeer = true // nothing recorded in the state (features.go): pruneOK alone decides
	n0 := openNode(t, cfg)
	if n0.tk.pruneOK.Store(false); n0.tk.tickPrune(20) != 0 {
		t.Fatalf("prune limit %d before every server reads it, want 0 (the tick prunes all that is due)", n0.tk.tickPrune(20))
	}
	if n0.tk.pruneOK.Store(true); n0.tk.tickPrune(20) != 20 {
		t.Fatalf("prune limit %d once every server reads it, want 20", n0.tk.tickPrune(20))
	}
	if got := n0.tk.tickPrune(0); got != 0 {
		t.Fatalf("prune limit %d on a tick without an expiry limit, want 0", got)
	}
}

// TestUnchunkedExpiryWithAnOlderServer: while a server of the
// configuration does not read limited ticks and Expire entries, the
// leader's ticks are unlimited and it proposes no Expire entry: a storm
// larger than a chunk ends in one tick.
func TestUnchunkedExpiryWithAnOlderServer(t *testing.T) {
	const n, chunk = 150, 20
	cfg := testConfig(t, "")
	cfg.expireChunk = chunk
	cfg.olderPeer = true
	n0 := openNode(t, cfg)
	sub, _ := startStorm(t, n0, n, true)
	perIndex := map[uint64]int{}
	awaitExpired(t, sub, n, func(ev wire.Event) { perIndex[ev.Index]++ })
	if len(perIndex) != 1 {
		t.Fatalf("%d leases bound to one session expired in %d entries (%v), want one unlimited tick", n, len(perIndex), perIndex)
	}
}

// recordedLog keeps a copy of every command entry Raft stores.
type recordedLog struct {
	raft.LogStore
	mu   sync.Mutex
	data [][]byte
}

func (r *recordedLog) StoreLog(l *raft.Log) error { return r.StoreLogs([]*raft.Log{l}) }

func (r *recordedLog) StoreLogs(ls []*raft.Log) error {
	r.mu.Lock()
	for _, l := range ls {
		if l.Type == raft.LogCommand {
			r.data = append(r.data, bytes.Clone(l.Data))
		}
	}
	r.mu.Unlock()
	return r.LogStore.StoreLogs(ls)
}

// TestExpireEntriesStandAlone: while writes go on through a storm, every
// Expire entry holds that Expire alone, and writes commit in entries of
// their own between them, so that a write waits behind at most the one
// chunk applying when it was proposed (BenchmarkExpiryStormWrites: the
// slowest write halved).
func TestExpireEntriesStandAlone(t *testing.T) {
	const n, chunk = 400, 20
	cfg := testConfig(t, "")
	cfg.expireChunk = chunk
	rec := &recordedLog{}
	cfg.WrapRaftStores = func(l raft.LogStore, s raft.StableStore) (raft.LogStore, raft.StableStore) {
		rec.LogStore = l
		return rec, s
	}
	n0 := openNode(t, cfg)
	ctx := context.Background()
	sub, _ := startStorm(t, n0, n, false)
	var writes atomic.Int64
	stopWriters := untilStopped(4, func(w, i int) bool {
		l, _, err := n0.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("w/%d/%d", w, i), Holder: "w", TTLMS: 60_000})
		if err == nil {
			_, err = n0.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
		}
		if err != nil {
			t.Error(err)
			return false
		}
		writes.Add(2)
		return true
	})
	awaitExpired(t, sub, n, nil)
	stopWriters()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// between counts the gaps between two Expire entries that hold an
	// entry of writes: the batcher alternates them when both wait.
	expires, between, sinceExpire := 0, 0, -1
	for i, data := range rec.data {
		cmd, err := fsm.Decode(data)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if _, ok := cmd.(*fsm.Expire); ok {
			if sinceExpire > 0 {
				between++
			}
			expires++
			sinceExpire = 0
			continue
		}
		if sinceExpire >= 0 {
			sinceExpire++
		}
		if b, ok := cmd.(*fsm.Batch); ok {
			for _, c := range b.Commands {
				if _, ok := c.(*fsm.Expire); ok {
					t.Fatalf("an Expire shares an entry with %d other commands", len(b.Commands)-1)
				}
			}
		}
	}
	if expires < 2 || writes.Load() == 0 || between == 0 {
		t.Fatalf("%d Expire entries, %d writes, %d gaps between Expire entries with another entry: the storm did not run beside writes",
			expires, writes.Load(), between)
	}
	t.Logf("%d Expire entries, %d of the gaps between them hold other entries, %d writes", expires, between, writes.Load())
}

// untilStopped runs workers goroutines, each calling op(worker, i) for i =
// 0, 1, ... until op returns false or the returned stop is called; stop
// waits for them all.
func untilStopped(workers int, op func(w, i int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if !op(w, i) {
					return
				}
			}
		}()
	}
	return func() {
		close(done)
		wg.Wait()
	}
}
