package cluster

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// flakyLogStore fails every failEvery-th StoreLogs while armed: the
// follower then answers the leader's AppendEntries with Success=false,
// which is what aborts a replication pipeline.
type flakyLogStore struct {
	raft.LogStore
	armed     atomic.Bool
	calls     atomic.Int64
	failed    atomic.Int64
	failEvery int64
}

func (s *flakyLogStore) StoreLogs(logs []*raft.Log) error {
	if s.armed.Load() && s.calls.Add(1)%s.failEvery == 0 {
		s.failed.Add(1)
		return errors.New("injected store failure")
	}
	return s.LogStore.StoreLogs(logs)
}

func (s *flakyLogStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(io.ReadCloser) error         { return nil }

// TestPipelineSurvivesRejectedAppends runs two real Raft servers over TCP
// with pipelined replication (MaxRPCsInFlight 2, raft's default) while the
// follower rejects many appends. With raft's own pipeline the follower is
// often left with heartbeats and no entries, and Shutdown hangs
// (hashicorp/raft#612); through pipelineTransport it keeps up.
func TestPipelineSurvivesRejectedAppends(t *testing.T) {
	if testing.Short() {
		t.Skip("real Raft servers")
	}
	logger := hclog.NewNullLogger()
	mk := func(id string, logs raft.LogStore) (*raft.Raft, *raft.NetworkTransport) {
		t.Helper()
		nt, err := raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, &raft.NetworkTransportConfig{
			MaxPool: 2, MaxRPCsInFlight: 2, Timeout: 10 * time.Second, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		conf := raft.DefaultConfig()
		conf.LocalID = raft.ServerID(id)
		conf.Logger = logger
		// A leader steps down when it has not heard from the follower for
		// LeaderLeaseTimeout; on a busy machine a short one makes it
		// resign mid-test, which is not the fault under test.
		conf.HeartbeatTimeout, conf.ElectionTimeout, conf.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, 2*time.Second
		if id == "b" {
			// The follower never stands for election: on a busy machine
			// a missed heartbeat would otherwise make it the leader, and
			// its own (failing) log store would be the leader's.
			conf.HeartbeatTimeout, conf.ElectionTimeout = time.Hour, time.Hour
		}
		conf.CommitTimeout = 5 * time.Millisecond
		store := raft.NewInmemStore()
		if logs == nil {
			logs = store
		}
		r, err := raft.NewRaft(conf, nopFSM{}, logs, store, raft.NewInmemSnapshotStore(), newPipelineTransport(nt))
		if err != nil {
			t.Fatal(err)
		}
		return r, nt
	}
	leader, lt := mk("a", nil)
	flaky := &flakyLogStore{LogStore: raft.NewInmemStore(), failEvery: 7}
	follower, ft := mk("b", flaky)
	shut := func(r *raft.Raft) {
		done := make(chan error, 1)
		go func() { done <- r.Shutdown().Error() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("Raft.Shutdown did not return within 30 s: a replication pipeline is wedged")
		}
	}
	defer lt.Close()
	defer ft.Close()
	defer shut(follower)
	defer shut(leader)

	if err := leader.BootstrapCluster(raft.Configuration{Servers: []raft.Server{
		{ID: "a", Address: lt.LocalAddr()}, {ID: "b", Address: ft.LocalAddr()}}}).Error(); err != nil {
		t.Fatal(err)
	}
	isLeader := func() bool { return leader.State() == raft.Leader }
	waitFor(t, 30*time.Second, "a becomes leader", isLeader)
	// Writes keep the pipeline busy while the follower rejects every
	// seventh append, until it has rejected 60 (each one aborts and
	// restarts the pipeline: each a chance to wedge it).
	flaky.armed.Store(true)
	deadline := time.Now().Add(60 * time.Second)
	for flaky.failed.Load() < 60 {
		if time.Now().After(deadline) {
			t.Fatalf("the follower rejected only %d appends in 60 s: replication stopped", flaky.failed.Load())
		}
		futs := make([]raft.ApplyFuture, 0, 16)
		for i := range 16 {
			futs = append(futs, leader.Apply([]byte(fmt.Sprint(i)), 0))
		}
		// With a majority of two, a write commits only once the follower
		// has it: a wedged pipeline shows as writes that never commit.
		errc := make(chan error, 1)
		go func() {
			var first error
			for _, f := range futs {
				if err := f.Error(); err != nil && first == nil {
					first = err
				}
			}
			errc <- first
		}()
		select {
		case err := <-errc:
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				// The leader resigned (a stalled machine can starve it of
				// the follower's answers) and wins the next election, as the
				// follower never stands: wait for that and go on. A wedged
				// pipeline still shows, as appends that stop being rejected.
				waitFor(t, time.Until(deadline), "a becomes leader again after resigning", isLeader)
			} else if err != nil {
				t.Fatalf("write failed: %v", err)
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("writes never committed after the follower rejected %d appends: its replication pipeline is wedged", flaky.failed.Load())
		}
	}
	flaky.armed.Store(false)
	want := leader.LastIndex()
	waitFor(t, time.Until(deadline), fmt.Sprintf("the follower reaches the leader's index %d", want),
		func() bool { return follower.LastIndex() >= want })
}
