package cluster

import (
	"errors"
	"fmt"
	"time"

	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/hashicorp/raft"
)

// This file is what the server sees of Raft: its state, the log's indexes,
// proposals, reads, snapshots and the configuration's changes. The
// *raft.Raft itself stays inside the package.

// State is a server's Raft state.
type State string

// The Raft states.
const (
	Follower  State = "Follower"
	Candidate State = "Candidate"
	Leader    State = "Leader"
	Shutdown  State = "Shutdown"
)

// State is this server's Raft state.
func (c *Cluster) State() State { return State(c.raft.State().String()) }

// IsLeader reports whether this server is the leader (Raft's view; a
// leader may still be catching up: see node's readiness).
func (c *Cluster) IsLeader() bool { return c.raft.State() == raft.Leader }

// Leader is the current leader's Raft address and id, empty when none is
// known.
func (c *Cluster) Leader() (addr, id string) {
	a, i := c.raft.LeaderWithID()
	return string(a), string(i)
}

// Term is this server's current Raft term.
func (c *Cluster) Term() uint64 { return c.raft.CurrentTerm() }

// CommitIndex is the latest index this server knows to be committed.
func (c *Cluster) CommitIndex() uint64 { return c.raft.CommitIndex() }

// LastIndex is the last index in this server's log or snapshot.
func (c *Cluster) LastIndex() uint64 { return c.raft.LastIndex() }

// AppliedIndex is the last index Raft handed to the state machine.
func (c *Cluster) AppliedIndex() uint64 { return c.raft.AppliedIndex() }

// LastContact is when a follower last heard from its leader (zero on a
// leader).
func (c *Cluster) LastContact() time.Time { return c.raft.LastContact() }

// Stats is Raft's own diagnostics (see raft.Raft.Stats).
func (c *Cluster) Stats() map[string]string { return c.raft.Stats() }

// Server is one server of a configuration.
type Server struct {
	ID string
	// Address is its Raft address, as the others dial it.
	Address string
	// Voter: it votes and counts toward a quorum; false: a non-voter (it
	// replicates only, until autopilot promotes it).
	Voter bool
}

// Configuration is the set of servers Raft replicates to.
type Configuration struct{ Servers []Server }

func fromRaft(conf raft.Configuration) Configuration {
	out := Configuration{Servers: make([]Server, len(conf.Servers))}
	for i, s := range conf.Servers {
		out.Servers[i] = Server{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter}
	}
	return out
}

func (s Server) raft() raft.Server {
	suffrage := raft.Nonvoter
	if s.Voter {
		suffrage = raft.Voter
	}
	return raft.Server{ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Address), Suffrage: suffrage}
}

// Configuration is the latest Raft configuration (committed or not).
func (c *Cluster) Configuration() (Configuration, error) {
	conf, err := c.raftConfiguration()
	if err != nil {
		return Configuration{}, err
	}
	return fromRaft(conf), nil
}

func (c *Cluster) raftConfiguration() (raft.Configuration, error) {
	fut := c.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return fut.Configuration(), nil
}

// ApplyFuture is a proposal in flight.
type ApplyFuture interface {
	// Error waits until the entry applied here, or failed (see
	// ClassifyApply).
	Error() error
	// Response is the state machine's answer to the entry.
	Response() any
	// Index is the entry's log index.
	Index() uint64
}

// Apply proposes one log entry; the future answers once it is applied
// here (or failed).
func (c *Cluster) Apply(data []byte, timeout time.Duration) ApplyFuture {
	return c.raft.Apply(data, timeout)
}

// Barrier returns once every entry before it is applied on this leader.
func (c *Cluster) Barrier(timeout time.Duration) error { return c.raft.Barrier(timeout).Error() }

// VerifyLeader confirms with a quorum that this server still leads.
func (c *Cluster) VerifyLeader() error { return c.raft.VerifyLeader().Error() }

// Snapshot takes a Raft snapshot now; Open on the future reads it.
func (c *Cluster) Snapshot() raft.SnapshotFuture { return c.raft.Snapshot() }

// AddNonvoter adds a server that replicates without a vote (autopilot
// promotes it once it is stable).
func (c *Cluster) AddNonvoter(id, addr string, timeout time.Duration) error {
	return c.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout).Error()
}

// RemoveServer removes a server from the configuration.
func (c *Cluster) RemoveServer(id string, timeout time.Duration) error {
	return c.raft.RemoveServer(raft.ServerID(id), 0, timeout).Error()
}

// TransferLeadership hands leadership to the most up-to-date follower.
func (c *Cluster) TransferLeadership() error { return c.raft.LeadershipTransfer().Error() }

// TransferLeadershipTo hands leadership to one server.
func (c *Cluster) TransferLeadershipTo(id, addr string) error {
	return c.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr)).Error()
}

// newAutopilot makes an autopilot that manages this server's Raft
// configuration through d (see node's reconcile). Its latest state also
// ranks the servers StepDown hands leadership to.
func (c *Cluster) newAutopilot(d autopilot.ApplicationIntegration, opts ...autopilot.Option) *autopilot.Autopilot {
	return autopilot.New(c.raft, recordingPilot{d, c}, opts...)
}

// ServerHealth is autopilot's latest view of one server.
type ServerHealth struct {
	Healthy bool
	// LastContact is how long ago the server last heard from the leader
	// (negative: unknown); LastTerm and LastIndex its log's last entry.
	LastContact         time.Duration
	LastTerm, LastIndex uint64
}

// ServerHealth is autopilot's latest view of the servers, by id (on the
// leader; nil before its first pass).
func (c *Cluster) ServerHealth() map[string]ServerHealth {
	st := c.apState.Load()
	if st == nil {
		return nil
	}
	out := make(map[string]ServerHealth, len(st.Servers))
	for id, s := range st.Servers {
		out[string(id)] = ServerHealth{Healthy: s.Health.Healthy, LastContact: s.Stats.LastContact,
			LastTerm: s.Stats.LastTerm, LastIndex: s.Stats.LastIndex}
	}
	return out
}

// WatchLeader calls fn with the new leader's id each time this server
// observes a leader change, until stop is called.
func (c *Cluster) WatchLeader(fn func(id string)) (stop func()) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(obs)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case o := <-ch:
				fn(string(o.Data.(raft.LeaderObservation).LeaderID))
			}
		}
	}()
	return func() {
		c.raft.DeregisterObserver(obs)
		close(done)
		<-exited
	}
}

// bootstrap forms a new cluster of servers on this server's empty state.
func (c *Cluster) bootstrap(servers []raft.Server) error {
	if err := c.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		return fmt.Errorf("cluster: bootstrap: %w", err)
	}
	return nil
}

// ApplyClass says what a failed proposal means for the write it carried.
type ApplyClass int

const (
	// NotLeader: never appended, this server does not lead.
	NotLeader ApplyClass = iota + 1
	// Busy: never appended, the leader could not take it now (it is
	// handing leadership on, or its loop did not take the entry in time);
	// the same proposal may simply be sent again.
	Busy
	// Indeterminate: it may have been appended, and may still commit.
	Indeterminate
)

// ApplyError is a failed Apply, classified.
type ApplyError struct {
	Class ApplyClass
	Msg   string
	Err   error // Raft's
}

func (e *ApplyError) Error() string { return e.Msg }
func (e *ApplyError) Unwrap() error { return e.Err }

// ClassifyApply classifies a failed Apply. Three errors prove the entry was
// never appended, so the write did not happen: ErrNotLeader (NotLeader),
// ErrLeadershipTransferInProgress (the leader refuses new entries while it
// hands leadership on) and ErrEnqueueTimeout (the entry could not even be
// handed to Raft's leader loop in time), both Busy. Anything else may have
// been appended: Indeterminate.
func ClassifyApply(err error) *ApplyError {
	e := &ApplyError{Class: Indeterminate, Err: err}
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		e.Class, e.Msg = NotLeader, "this node is not the leader"
	case errors.Is(err, raft.ErrLeadershipTransferInProgress):
		e.Class, e.Msg = Busy, "the leader is handing leadership on and accepts no writes meanwhile; the write was not applied, retry shortly"
	case errors.Is(err, raft.ErrEnqueueTimeout):
		e.Class, e.Msg = Busy, "timed out waiting to propose the write; it was not applied, retry shortly"
	case errors.Is(err, raft.ErrLeadershipLost):
		e.Msg = "leadership was lost while the write was in flight; it may or may not have been applied"
	default:
		e.Msg = "the write may or may not have been applied: " + err.Error()
	}
	return e
}

// LeadsIn reports whether this server leads in term. State is read before
// the term: the term cannot go back, so leader then term means leader in
// that term, and a server never leads twice in one term.
func (c *Cluster) LeadsIn(term uint64) bool { return c.IsLeader() && c.Term() == term }

// ReadIndex is the read barrier of a leader established in term: the
// commit index read while it led in term, confirmed afterwards by a quorum
// (so it covers every write acknowledged before the call) while it still
// leads in term. A linearizable read waits until that index is applied.
func (c *Cluster) ReadIndex(term uint64) (uint64, error) {
	if !c.LeadsIn(term) {
		return 0, raft.ErrNotLeader
	}
	commit := c.CommitIndex()
	if err := c.VerifyLeader(); err != nil {
		return 0, err
	}
	if !c.LeadsIn(term) {
		return 0, raft.ErrNotLeader
	}
	return commit, nil
}

// ServerIDs are the ids of the servers of the latest configuration.
func (c *Cluster) ServerIDs() ([]string, error) {
	conf, err := c.Configuration()
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(conf.Servers))
	for _, s := range conf.Servers {
		ids = append(ids, string(s.ID))
	}
	return ids, nil
}
