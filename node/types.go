package node

// Stats are counters for /metrics. Totals count since the process started.
type Stats struct {
	ActiveLeases      int
	ActiveSessions    int
	Acquired          uint64
	Renewed           uint64
	Released          uint64
	Expired           uint64
	Revoked           uint64
	SessionsCreated   uint64
	SessionHeartbeats uint64
	LateHeartbeats    uint64
	SessionsExpired   uint64
	CommitIndex       uint64
	AppliedIndex      uint64
	Tick              uint64
	IsLeader          bool
	// ApplyLatency is a histogram of proposal-to-apply latency in seconds:
	// cumulative counts per upper bound in ApplyBuckets, plus sum and count.
	ApplyBuckets []float64
	ApplyCounts  []uint64
	ApplySum     float64
	ApplyCount   uint64
	EventStreams int
}
