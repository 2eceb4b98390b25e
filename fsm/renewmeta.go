package fsm

// Renewals that carry metadata. A renewal (Renew) or a bulk heartbeat item
// (HeartbeatItem) may replace the lease's metadata, atomically with the
// renewal: a fleet worker reports its processing statistics with each
// heartbeat, an election's leader proclaims a new value. The replacement
// applies only if the renewal does (same token, state and expiry checks);
// metadata past its limits (ValidMetadata) is refused and nothing changes.
// A lease bound to a session is not renewed on its own (its session's
// heartbeat does that), but a renewal of it that carries metadata updates
// the metadata (and counts as a renewal) without touching its expiry.
//
// They are types of their own, so no earlier type's encoding changes, and
// are proposed only once every server reads them (the node checks gossip).
const (
	// TypeRenewMeta is a Renew whose SetMetadata is set: a Renew's body
	// followed by the metadata map.
	TypeRenewMeta Type = 20
	// TypeHeartbeatMeta is a Heartbeat with at least one item whose
	// SetMetadata is set (codec_commands.go: Heartbeat.encode).
	TypeHeartbeatMeta Type = 21
)

// Type is TypeRenew, or TypeRenewMeta when SetMetadata is set.
func (c *Renew) Type() Type {
	if c != nil && c.SetMetadata {
		return TypeRenewMeta
	}
	return TypeRenew
}

// Type is TypeHeartbeat, or TypeHeartbeatMeta when an item sets metadata.
func (c *Heartbeat) Type() Type {
	if c != nil {
		for i := range c.Items {
			if c.Items[i].SetMetadata {
				return TypeHeartbeatMeta
			}
		}
	}
	return TypeHeartbeat
}
