package fsm

// Cluster features: capabilities that change what the cluster writes (entry
// checksums, chunked expiry, restores through the log), which the leader may
// use only once every server reads them. The leader learns that from gossip,
// which forgets a server that is down; once it has seen every server of the
// configuration announce a feature, it records the feature here, in the
// replicated state, through a Features command. Like the cluster id, the
// record is one-way: a later Features command adds bits, none removes them,
// snapshots carry them, and a restore keeps the running cluster's. A
// server of a release before a recorded feature cannot join the cluster
// afterwards (ForPreviousRelease clears the record for a rollback).

// Features are bits of the cluster's recorded capabilities.
type Features uint64

// The recorded features. Bits unknown to this release are kept as they are.
const (
	// FeatureEntryCRC: entries carry a checksum (VersionChecked).
	FeatureEntryCRC Features = 1 << iota
	// FeatureChunkedExpiry: ticks carry an expiry limit (TypeTickLimited).
	FeatureChunkedExpiry
	// FeatureRestoreLog: restores go through the log (RestoreChunk,
	// RestoreCommit).
	FeatureRestoreLog
	// FeatureRestoreBounds: a restore commit carries the count limits and
	// a fence floor (TypeRestoreCommitBounded).
	FeatureRestoreBounds
	// FeatureChunkedPrune: ticks carry a prune limit (TypeTickPruned).
	FeatureChunkedPrune
)

// Has reports whether every bit of want is set in fs.
func (fs Features) Has(want Features) bool { return fs&want == want }

// FeaturesCmd records features of the cluster (in addition to those
// recorded before).
type FeaturesCmd struct {
	// Features are the bits to record; 0 changes nothing.
	Features Features `json:"features"`
}

// TypeFeatures is the type of a FeaturesCmd entry.
const TypeFeatures Type = 27

func (*FeaturesCmd) Type() Type { return TypeFeatures }

// featuresCmd applies a FeaturesCmd: its bits are added to the record.
func (r *registry) featuresCmd(c *FeaturesCmd) Result {
	r.features |= c.Features
	return Result{}
}

// Features returns the cluster's recorded features; 0 until a FeaturesCmd
// with bits applied.
func (r *registry) Features() Features { return r.features }

func (c *FeaturesCmd) fields(f fields) { f.uvarint((*uint64)(&c.Features)) }
