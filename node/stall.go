package node

import (
	"cmp"
	"fmt"
	"time"
)

// A frozen follower. Raft alone does not make a stuck server look unready:
// one whose log store hangs (a stalled disk) holds its Raft loop in an
// append, keeps naming its leader, has applied everything it knows to be
// committed, and over TCP keeps answering heartbeats (they bypass the
// loop). Its applied index stands still while the cluster goes on; a
// healthy follower applies a tick every tick period. So a follower whose
// applied index has not advanced for ApplyStallTimeout is frozen when it
// also has evidence that the cluster went on without it:
//   - its commit index is ahead of its applied index (its state machine
//     does not apply what it knows to be committed);
//   - its Raft loop has not heard from the leader it still follows for as
//     long (a running follower would have started an election and
//     forgotten that leader after an election timeout);
//   - the leader's last log index, as gossip reported it within that time,
//     is ahead of its own (its log takes none of the leader's appends).
// A leader is never frozen here: its watchdog hands leadership on when it
// commits nothing (node.go). A follower of a leader that commits nothing
// (a stall of the whole cluster) has none of the evidence, and stays ready.

// stallView is what the decision looks at.
type stallView struct {
	stalled       time.Duration // since the applied index last advanced
	applied       uint64
	commit        uint64        // Raft's commit index, as this server knows it
	lastIndex     uint64        // of this server's log
	leader        string        // the leader this server follows
	contact       time.Duration // since the Raft loop last heard from it; <0: never
	leaderIndex   uint64        // the leader's last log index (gossip), when known
	leaderIndexOK bool
}

// stallReason says why v is a frozen follower, or "" when it is not.
func stallReason(v stallView, timeout time.Duration) string {
	if v.stalled < timeout || v.leader == "" {
		return ""
	}
	head := fmt.Sprintf("frozen: the applied index (%d) has not advanced for %v while the cluster went on: ",
		v.applied, v.stalled.Round(100*time.Millisecond))
	switch {
	case v.commit > v.applied:
		return head + fmt.Sprintf("the commit index (%d) is ahead of it; the state machine does not apply", v.commit)
	case v.contact < 0 || v.contact >= timeout:
		return head + fmt.Sprintf("no contact with the leader %s for %v; the Raft loop does not run", v.leader, v.contact.Round(100*time.Millisecond))
	case v.leaderIndexOK && v.leaderIndex > v.lastIndex:
		return head + fmt.Sprintf("the leader's log reaches %d, this server's %d; its log takes no appends", v.leaderIndex, v.lastIndex)
	}
	return ""
}

// applyStallTimeout is Config.ApplyStallTimeout or its default.
func (c *Config) applyStallTimeout() time.Duration {
	return cmp.Or(c.ApplyStallTimeout, DefaultApplyStallTimeout)
}
