package cluster

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// errCut answers an RPC the test dropped, as a cut link would.
var errCut = errors.New("test: link cut")

// snapHold wraps the leader's transport. Once cut, every AppendEntries
// (heartbeats too) to target is dropped, and an InstallSnapshot to target
// waits until release is closed; its answer is then kept in answered.
// Every other RPC passes as it came.
type snapHold struct {
	raft.Transport
	target raft.ServerID

	mu       sync.Mutex
	cut      bool
	release  chan struct{}
	answered chan error // the first InstallSnapshot's answer
	term     uint64     // its request's term
	once     sync.Once
}

func (h *snapHold) isCut(id raft.ServerID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut && id == h.target
}

func (h *snapHold) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if h.isCut(id) {
		return errCut
	}
	return h.Transport.AppendEntries(id, target, args, resp)
}

// AppendEntriesPipeline: never to target, whose appends go one by one
// through AppendEntries (and are dropped there once cut).
func (h *snapHold) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if id == h.target {
		return nil, raft.ErrPipelineReplicationNotSupported
	}
	return h.Transport.AppendEntriesPipeline(id, target)
}

func (h *snapHold) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if h.isCut(id) {
		<-h.release
	}
	err := h.Transport.InstallSnapshot(id, target, args, resp, data)
	if id == h.target {
		h.once.Do(func() {
			h.mu.Lock()
			h.term = args.Term
			h.mu.Unlock()
			h.answered <- err
		})
	}
	return err
}

func (h *snapHold) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return h.Transport.(raft.WithPreVote).RequestPreVote(id, target, args, resp)
}

func (h *snapHold) Close() error { return h.Transport.(raft.WithClose).Close() }

// setTimeouts sets c's heartbeat and election timeouts.
func setTimeouts(t *testing.T, c *Cluster, d time.Duration) {
	t.Helper()
	rc := c.raft.ReloadableConfig()
	rc.HeartbeatTimeout, rc.ElectionTimeout = d, d
	if err := c.raft.ReloadConfig(rc); err != nil {
		t.Fatalf("%s: timeouts %v: %v", c.cfg.NodeID, d, err)
	}
}

// TestCandidateSnapshotThenLeaderLost stages, step by step, the
// interleaving the snapshot gate (candsnap.go) exists for, over TCP with
// raft.db and over the in-memory transport and stores: n2 falls behind
// the leader n0's snapshot while n0's appends and heartbeats to it are
// dropped, times out and pre-votes (its term unchanged; n1, which hears
// n0, refuses), and only then gets n0's InstallSnapshot; n0 is lost. n1
// and n2 must elect a leader. Taking that snapshot as a candidate leaves
// n2 sure n0 leads: it refuses n1's every pre-vote, and n1, ahead of n2,
// refuses n2's, so none is ever elected. Built with
// -tags canary_no_snapshot_gate (the gate taken out) this test fails.
//
// The verdict does not depend on the machine's speed: until n0 is
// stopped, n1 and n2 have timeouts they never reach unless the test
// lowers them, every step waits for the state the previous one made, and
// a step that did not hold fails as such ("staging: ...").
func TestCandidateSnapshotThenLeaderLost(t *testing.T) {
	if testing.Short() {
		t.Skip("real Raft servers")
	}
	t.Run("tcp", func(t *testing.T) { candidateSnapshotThenLeaderLost(t, false) })
	t.Run("inmem", func(t *testing.T) { candidateSnapshotThenLeaderLost(t, true) })
}

func candidateSnapshotThenLeaderLost(t *testing.T, inMemory bool) {
	const (
		never = time.Hour
		short = 300 * time.Millisecond
		bound = 20 * time.Second // for n1 and n2 to elect a leader once n0 is gone
	)
	hold := &snapHold{target: "n2", release: make(chan struct{}), answered: make(chan error, 1)}
	// n0's lease is its timeouts (a loaded machine does not depose it);
	// n1's and n2's is short, the timeouts the test lowers theirs to.
	open := func(id string, timeout, lease time.Duration, wrap func(raft.Transport) raft.Transport) *Cluster {
		t.Helper()
		cfg := Config{NodeID: id, InMemory: true, TrailingLogs: 1,
			HeartbeatTimeout: timeout, ElectionTimeout: timeout, LeaderLeaseTimeout: lease, WrapTransport: wrap}
		if !inMemory {
			cfg.InMemory, cfg.Dir, cfg.BindAddr = false, t.TempDir(), "127.0.0.1:0"
		}
		c, err := Open(cfg, &countFSM{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// n0 alone stands for election.
	n0 := open("n0", 2*time.Second, 2*time.Second, func(tr raft.Transport) raft.Transport { hold.Transport = tr; return hold })
	n1 := open("n1", never, short, nil)
	n2 := open("n2", never, short, nil)
	all := []*Cluster{n0, n1, n2}
	// A staging step that fails while n0 holds the snapshot would leave
	// n0's replication to n2 blocked, and n0's Close (a cleanup) waiting on
	// it: release it first (cleanups run last-registered first).
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold.release) }) }
	t.Cleanup(release)
	// unwrapped is c's own transport (n0's is wrapped in hold).
	unwrapped := func(c *Cluster) raft.Transport {
		if c == n0 {
			return hold.Transport
		}
		return c.Transport()
	}
	if inMemory {
		for _, a := range all {
			for _, b := range all {
				if a != b {
					unwrapped(a).(raft.WithPeers).Connect(raft.ServerAddress(b.Addr), unwrapped(b))
				}
			}
		}
	}
	servers := []Server{{ID: "n0", Address: n0.Addr, Voter: true}, {ID: "n1", Address: n1.Addr, Voter: true},
		{ID: "n2", Address: n2.Addr, Voter: true}}
	for _, c := range all {
		if err := c.BootstrapWith(servers); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "n0 leads", n0.IsLeader)
	apply := func(n int) {
		t.Helper()
		for i := range n {
			if err := n0.Apply(fmt.Appendf(nil, "%d", i), 10*time.Second).Error(); err != nil {
				t.Fatalf("apply on n0: %v", err)
			}
		}
	}
	apply(1)
	waitFor(t, 30*time.Second, "n2 follows n0, caught up", func() bool {
		_, id := n2.Leader()
		return id == "n0" && n2.LastIndex() == n0.LastIndex()
	})
	term := n0.Term()

	// n2 falls behind n0's snapshot: the entries it lacks are compacted
	// away (TrailingLogs 1), and one more is written after the snapshot
	// (n1 has it, so n1 never grants n2 a vote).
	hold.mu.Lock()
	hold.cut = true
	hold.mu.Unlock()
	behind := n2.LastIndex()
	apply(3)
	if err := n0.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on n0: %v", err)
	}
	apply(1)

	// n2 hears nothing, times out and pre-votes: its term stays n0's,
	// and n1 (hearing n0) and n0 refuse it, so it stays a candidate.
	setTimeouts(t, n2, short)
	waitFor(t, 30*time.Second, "n2 becomes a candidate", func() bool { return n2.raft.State() == raft.Candidate })
	if n2.Term() != term || n2.LastIndex() != behind {
		t.Fatalf("staging: n2 at term %d index %d, want term %d index %d", n2.Term(), n2.LastIndex(), term, behind)
	}

	// The snapshot reaches the candidate, then n0 is lost.
	release()
	var snapErr error
	select {
	case snapErr = <-hold.answered:
	case <-time.After(60 * time.Second):
		t.Fatal("n0 sent n2 no snapshot within 60 s")
	}
	hold.mu.Lock()
	snapTerm := hold.term
	hold.mu.Unlock()
	if snapTerm != term || n2.Term() != term {
		t.Fatalf("staging: snapshot of term %d reached n2 at term %d, want both %d", snapTerm, n2.Term(), term)
	}
	t.Logf("n0's InstallSnapshot to candidate n2 (term %d) answered: %v", term, snapErr)
	if err := n0.Close(); err != nil {
		t.Fatalf("close n0: %v", err)
	}
	if inMemory {
		// As a closed port refuses a connection: without this the
		// others' RPCs to n0 wait out the in-memory transport's timeout.
		for _, c := range []*Cluster{n1, n2} {
			c.Transport().(raft.WithPeers).Disconnect(raft.ServerAddress(n0.Addr))
		}
	}
	setTimeouts(t, n1, short)

	deadline := time.Now().Add(bound)
	for !n1.IsLeader() && !n2.IsLeader() {
		if time.Now().After(deadline) {
			view := func(c *Cluster) string {
				_, lid := c.Leader()
				return fmt.Sprintf("%s: %v term %d index %d leader %q", c.cfg.NodeID, c.raft.State(), c.Term(), c.LastIndex(), lid)
			}
			t.Fatalf("no leader within %v of n0's loss (%s; %s): a candidate that took a snapshot "+
				"of its term still believes in its sender and refuses every vote", bound, view(n1), view(n2))
		}
		<-time.After(5 * time.Millisecond)
	}
}
