package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Duplicated and reordered Raft messages (the in-process tier): every
// node's Raft transport is wrapped (node.Config.WrapRaftTransport) so that
// a request it sends can go out again, at once or after a delay, as a
// network that retransmits or reorders would deliver it. The copy's answer
// is dropped: the sender sees one answer per request, as over TCP. A
// delayed copy reaches the peer after later requests did (counted as
// reordered when one did). Appends (pipelined or not, heartbeats too),
// votes and pre-votes are copied at once or late; a snapshot install is
// copied at once only (its data held in memory, up to 64 MiB): Raft
// installs any snapshot of the current term a leader sends, stale or not,
// so a late copy would take a follower's state back to an older index
// until it re-applies, which no network the suite models does (TCP never
// hands over a message twice; a leader sends a snapshot only while it
// waits for its answer).

// msgFaults decides, for every node's transport, which requests are copied
// and when; the counts prove the fault happened.
type msgFaults struct {
	mu     sync.Mutex
	rng    *rand.Rand
	dup    float64       // probability that a request is sent again
	delay  time.Duration // a copy waits up to this long (half of them go at once)
	seq    map[raft.ServerAddress]uint64
	counts map[string]int
	wg     sync.WaitGroup // late copies in flight
}

func newMsgFaults() *msgFaults {
	return &msgFaults{rng: rand.New(rand.NewPCG(1, 2)), seq: map[raft.ServerAddress]uint64{}, counts: map[string]int{}}
}

// set turns copying on (dup > 0) or off, with a fresh seeded choice.
func (m *msgFaults) set(seed uint64, dup float64, delay time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m.dup, m.delay = dup, delay
}

// snapshot returns the counts so far.
func (m *msgFaults) snapshot() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.counts))
	for k, v := range m.counts {
		out[k] = v
	}
	return out
}

// sent notes a request to target and decides whether it goes out again:
// copy reports so, after wait (0: at once); seq is the request's number
// towards target. Appends are copied with probability dup; votes and
// pre-votes (a few per election) with twice that, and snapshot installs
// (rare) always, so that a short run copies each kind.
func (m *msgFaults) sent(kind string, target raft.ServerAddress) (seq uint64, copy bool, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq[target]++
	seq = m.seq[target]
	p := m.dup
	switch {
	case p <= 0:
		return seq, false, 0
	case kind == "snapshot":
		return seq, true, 0 // at once only (see above)
	case kind != "append":
		p = min(1, 2*p)
	}
	if m.rng.Float64() >= p {
		return seq, false, 0
	}
	if m.delay > 0 && m.rng.IntN(2) == 0 {
		wait = time.Duration(1 + m.rng.Int64N(int64(m.delay)))
	}
	return seq, true, wait
}

// again sends a copy of request seq to target through send, now or after
// wait, and counts it: kind-duplicated when the peer answered the copy
// (it arrived), and kind-reordered too when a later request to target had
// gone out before it; kind-copy-failed when it got no answer (a partition,
// a closed node).
func (m *msgFaults) again(kind string, target raft.ServerAddress, seq uint64, wait time.Duration, send func() error) {
	run := func() {
		m.mu.Lock()
		reordered := m.seq[target] > seq
		m.mu.Unlock()
		err := send()
		m.mu.Lock()
		switch {
		case err != nil:
			m.counts[kind+"-copy-failed"]++
		case reordered:
			m.counts[kind+"-reordered"]++
			fallthrough
		default:
			m.counts[kind+"-duplicated"]++
		}
		m.mu.Unlock()
	}
	if wait == 0 {
		run()
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		time.Sleep(wait)
		run()
	}()
}

// msgTransport is one node's Raft transport with msgFaults applied to what
// it sends.
type msgTransport struct {
	raft.Transport
	f *msgFaults
}

func (m *msgFaults) wrap(t raft.Transport) raft.Transport { return &msgTransport{Transport: t, f: m} }

var (
	_ raft.WithPreVote = (*msgTransport)(nil)
	_ raft.WithClose   = (*msgTransport)(nil)
)

func (t *msgTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.Transport.AppendEntries(id, target, args, resp)
	t.copyAppend(id, target, args)
	return err
}

// copyAppend maybe sends args to target again (a copy of the request as
// it is now: Raft builds a new one for every send).
func (t *msgTransport) copyAppend(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest) {
	seq, again, wait := t.f.sent("append", target)
	if !again {
		return
	}
	cp := *args
	cp.Entries = append([]*raft.Log(nil), args.Entries...)
	t.f.again("append", target, seq, wait, func() error {
		var r raft.AppendEntriesResponse
		return t.Transport.AppendEntries(id, target, &cp, &r)
	})
}

func (t *msgTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.Transport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return &msgPipeline{AppendPipeline: p, t: t, id: id, target: target}, nil
}

func (t *msgTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	err := t.Transport.RequestVote(id, target, args, resp)
	if seq, again, wait := t.f.sent("vote", target); again {
		cp := *args
		t.f.again("vote", target, seq, wait, func() error {
			var r raft.RequestVoteResponse
			return t.Transport.RequestVote(id, target, &cp, &r)
		})
	}
	return err
}

// RequestPreVote implements raft.WithPreVote (Raft uses pre-votes only
// when the transport has it; the network transport does).
func (t *msgTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return fmt.Errorf("chaos: the wrapped Raft transport has no pre-vote")
	}
	err := pv.RequestPreVote(id, target, args, resp)
	if seq, again, wait := t.f.sent("prevote", target); again {
		cp := *args
		t.f.again("prevote", target, seq, wait, func() error {
			var r raft.RequestPreVoteResponse
			return pv.RequestPreVote(id, target, &cp, &r)
		})
	}
	return err
}

// maxSnapshotCopy bounds the snapshot data held to send it again.
const maxSnapshotCopy = 64 << 20

func (t *msgTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	seq, again, _ := t.f.sent("snapshot", target)
	if !again || args.Size > maxSnapshotCopy {
		return t.Transport.InstallSnapshot(id, target, args, resp, data)
	}
	buf, err := io.ReadAll(io.LimitReader(data, args.Size))
	if err != nil {
		return err
	}
	err = t.Transport.InstallSnapshot(id, target, args, resp, bytes.NewReader(buf))
	if err == nil && resp.Success {
		// At once, while the leader still waits for this answer (see
		// above): the follower gets the same snapshot twice.
		cp := *args
		t.f.again("snapshot", target, seq, 0, func() error {
			var r raft.InstallSnapshotResponse
			return t.Transport.InstallSnapshot(id, target, &cp, &r, bytes.NewReader(buf))
		})
	}
	return err
}

// Close implements raft.WithClose.
func (t *msgTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// msgPipeline copies pipelined appends the same way.
type msgPipeline struct {
	raft.AppendPipeline
	t      *msgTransport
	id     raft.ServerID
	target raft.ServerAddress
}

func (p *msgPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	f, err := p.AppendPipeline.AppendEntries(args, resp)
	if err == nil {
		p.t.copyAppend(p.id, p.target, args)
	}
	return f, err
}

// raftMessageFaulter is a Cluster that can copy and delay Raft's messages
// (the in-process tier).
type raftMessageFaulter interface {
	RaftMessageFaults(seed uint64, dup float64, delay time.Duration)
	RaftMessageCounts() map[string]int
}

// RaftMessageFaults makes every node send each Raft request again with
// probability dup (0: never), half of the copies after up to delay; seed
// makes the choices replayable (their timing is not).
func (c *InprocCluster) RaftMessageFaults(seed uint64, dup float64, delay time.Duration) {
	c.msgs.set(seed, dup, delay)
}

// RaftMessageCounts returns how many Raft requests were copied, by kind
// (append, vote, prevote, snapshot): kind-duplicated, kind-reordered (the
// copy went out after a later request to the same peer), kind-copy-failed.
func (c *InprocCluster) RaftMessageCounts() map[string]int { return c.msgs.snapshot() }

// raftDupReorder: for the whole nemesis every node sends a third of its
// Raft appends again (half of the copies late, after later ones), twice as
// many of its votes and pre-votes, and every snapshot install twice; a
// follower is cut off until the leader compacts past it and healed (it
// catches up by a snapshot install), and leadership is handed on twice
// (elections: votes). The counts of copies that arrived, and of late ones
// that arrived after later requests, are the scenario's effect.
func (e *Env) raftDupReorder(ctx context.Context) error {
	mf, ok := e.C.(raftMessageFaulter)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot copy Raft messages: %w", e.Tier, ErrUnsupported)
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	mf.RaftMessageFaults(e.Rng.Uint64(), 0.3, 300*time.Millisecond)
	e.H.Note(Event{Type: "nemesis", Name: "raft-dup", Phase: "start", Detail: "Raft requests copied (appends 30%, votes 60%, snapshots all; half of the copies up to 300 ms late)"})
	defer func() {
		mf.RaftMessageFaults(0, 0, 0)
		counts := mf.RaftMessageCounts()
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(counts)) {
			e.Count(k, counts[k])
			parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
		}
		e.H.Note(Event{Type: "nemesis", Name: "raft-dup", Phase: "stop", Detail: strings.Join(parts, ", ")})
	}()
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	before, _ := e.Local(ctx, f, 0, time.Second)
	var cutAt uint64 // f's last index once cut off
	if err := e.Fault(ctx, "partition", fmt.Sprintf("follower %d alone while the leader compacts", f), faultFor,
		func() error {
			if err := e.C.Partition([][]int{{f}, e.Others(f)}); err != nil {
				return err
			}
			if ls, err := e.Local(ctx, f, 0, time.Second); err == nil {
				cutAt = ls.LastIndex
			}
			return nil
		}, func() error {
			// Cut off until the cluster has committed far enough past f
			// (a busy machine commits slowly) that the leader's snapshots
			// (every 64 entries, 32 kept behind) left f's log behind: up
			// to 14 s more.
			for end := time.Now().Add(14 * time.Second); cutAt > 0 && time.Now().Before(end); {
				if l := e.Leader(ctx); l >= 0 && l != f {
					if ls, err := e.Local(ctx, l, 0, time.Second); err == nil && ls.CommitIndex >= cutAt+3*64 {
						break
					}
				}
				if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
					return errors.Join(err, e.C.Heal())
				}
			}
			return e.C.Heal()
		}); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if ls, err := e.Local(ctx, f, 0, time.Second); err == nil && before != nil && ls.SnapshotsInstalled > before.SnapshotsInstalled {
			e.Count("snapshots-installed", ls.SnapshotsInstalled-before.SnapshotsInstalled)
			break
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	for range 2 {
		l, err := e.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			return err
		}
		if err := e.Admin(l).TransferLeadership(ctx, ""); err == nil {
			e.Count("transfers", 1)
		} else {
			e.Note("transfer", fmt.Sprintf("from node %d", l), err)
		}
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	return nil
}
