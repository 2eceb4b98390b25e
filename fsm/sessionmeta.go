package fsm

// Session heartbeats that carry metadata: a worker holding its leases on
// one session reports its statistics with each heartbeat, as a lease's
// renewal may (renewmeta.go). The metadata replaces the session's, in the
// heartbeat's entry, only if the heartbeat succeeds (right token, session
// active); metadata past its limits (ValidMetadata) is refused and nothing
// changes. Snapshots are unchanged: the metadata is part of a session's
// record.
//
// They are a type of their own, so no earlier type's encoding changes, and
// are proposed only once every server reads them (the node checks gossip).
const TypeSessionHeartbeatMeta Type = 26

// Type is TypeSessionHeartbeat, or TypeSessionHeartbeatMeta when
// SetMetadata is set.
func (c *SessionHeartbeat) Type() Type {
	if c != nil && c.SetMetadata {
		return TypeSessionHeartbeatMeta
	}
	return TypeSessionHeartbeat
}
