// Package diskfault wraps Raft's log and stable stores so that their writes
// can be stalled (every write waits until the stall ends, as behind an
// fsync that does not return) or slowed (every write takes longer). It is
// for fault injection: the chaos suite and tests install it through
// node.Config.WrapRaftStores, and a binary built with the `chaos` tag
// drives it from the chaos fault file. Reads pass through untouched (a
// bbolt reader does not wait for a writer's fsync).
package diskfault

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Fault is the switch of one or more wrapped stores. The zero value is no
// fault. It is safe for concurrent use.
type Fault struct {
	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed when the stall ends
	delay   time.Duration
	waiting int // writes held by a stall right now
}

// Set stalls (stall) or slows (delay > 0, each write) the wrapped stores'
// writes from now on; Set(false, 0) heals. A write already waiting on a
// stall proceeds as soon as the stall ends.
func (f *Fault) Set(stall bool, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = max(delay, 0)
	switch {
	case stall && f.stalled == nil:
		f.stalled = make(chan struct{})
	case !stall && f.stalled != nil:
		close(f.stalled)
		f.stalled = nil
	}
}

// Stalled reports whether writes are stalled now.
func (f *Fault) Stalled() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stalled != nil
}

// Waiting is how many writes a stall holds right now.
func (f *Fault) Waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting
}

// wait holds a write for the fault in force.
func (f *Fault) wait() {
	f.mu.Lock()
	delay, stalled := f.delay, f.stalled
	if stalled != nil {
		f.waiting++
	}
	f.mu.Unlock()
	if stalled != nil {
		<-stalled
		f.mu.Lock()
		f.waiting--
		delay = f.delay
		f.mu.Unlock()
	}
	if delay > 0 {
		time.Sleep(delay)
	}
}

// Wrap returns stores whose writes obey f.
func (f *Fault) Wrap(logs raft.LogStore, stable raft.StableStore) (raft.LogStore, raft.StableStore) {
	return &logStore{LogStore: logs, f: f}, &stableStore{StableStore: stable, f: f}
}

type logStore struct {
	raft.LogStore
	f *Fault
}

func (s *logStore) StoreLog(l *raft.Log) error {
	s.f.wait()
	return s.LogStore.StoreLog(l)
}

func (s *logStore) StoreLogs(ls []*raft.Log) error {
	s.f.wait()
	return s.LogStore.StoreLogs(ls)
}

func (s *logStore) DeleteRange(min, max uint64) error {
	s.f.wait()
	return s.LogStore.DeleteRange(min, max)
}

type stableStore struct {
	raft.StableStore
	f *Fault
}

func (s *stableStore) Set(k, v []byte) error {
	s.f.wait()
	return s.StableStore.Set(k, v)
}

func (s *stableStore) SetUint64(k []byte, v uint64) error {
	s.f.wait()
	return s.StableStore.SetUint64(k, v)
}
