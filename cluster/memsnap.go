package cluster

import (
	"bytes"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// memSnapshots is an in-memory raft.SnapshotStore keeping the latest
// snapshot. Unlike raft.InmemSnapshotStore, a snapshot becomes visible to
// List and Open only once its sink is closed: raft's own store publishes a
// sink at Create, so a leader sending its latest snapshot to a follower
// could read a buffer still being written (a data race, and a truncated
// snapshot on the follower).
type memSnapshots struct {
	mu     sync.RWMutex
	latest *memSnapshot
}

type memSnapshot struct {
	meta raft.SnapshotMeta
	data []byte
}

type memSnapshotSink struct {
	store *memSnapshots
	meta  raft.SnapshotMeta
	buf   bytes.Buffer
	done  bool
}

func newMemSnapshots() *memSnapshots { return &memSnapshots{} }

func (m *memSnapshots) Create(version raft.SnapshotVersion, index, term uint64,
	configuration raft.Configuration, configurationIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	if version != 1 {
		return nil, fmt.Errorf("unsupported snapshot version %d", version)
	}
	return &memSnapshotSink{store: m, meta: raft.SnapshotMeta{
		Version:            version,
		ID:                 fmt.Sprintf("%d-%d", term, index),
		Index:              index,
		Term:               term,
		Configuration:      configuration,
		ConfigurationIndex: configurationIndex,
	}}, nil
}

func (m *memSnapshots) List() ([]*raft.SnapshotMeta, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.latest == nil {
		return nil, nil
	}
	meta := m.latest.meta
	return []*raft.SnapshotMeta{&meta}, nil
}

func (m *memSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.latest == nil || m.latest.meta.ID != id {
		return nil, nil, fmt.Errorf("snapshot %s not found", id)
	}
	meta := m.latest.meta
	return &meta, io.NopCloser(bytes.NewReader(m.latest.data)), nil
}

func (s *memSnapshotSink) Write(p []byte) (int, error) {
	if s.done {
		return 0, fmt.Errorf("snapshot %s already closed", s.meta.ID)
	}
	return s.buf.Write(p)
}

// Close publishes the snapshot: from now on List and Open see it.
func (s *memSnapshotSink) Close() error {
	if s.done {
		return nil
	}
	s.done = true
	snap := &memSnapshot{meta: s.meta, data: bytes.Clone(s.buf.Bytes())}
	snap.meta.Size = int64(len(snap.data))
	s.store.mu.Lock()
	s.store.latest = snap
	s.store.mu.Unlock()
	return nil
}

func (s *memSnapshotSink) ID() string { return s.meta.ID }

// Cancel drops the snapshot; the one published before stays.
func (s *memSnapshotSink) Cancel() error {
	s.done = true
	return nil
}

// openedSnapshots tells opened (Config.SnapshotOpened) the metadata of
// every snapshot opened.
type openedSnapshots struct {
	raft.SnapshotStore
	opened func(raft.SnapshotMeta)
}

// Open implements raft.SnapshotStore.
func (s openedSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err == nil {
		s.opened(*meta)
	}
	return meta, rc, err
}
