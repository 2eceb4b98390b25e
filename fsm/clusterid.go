package fsm

import "github.com/leasehold/leasehold/wire"

// The cluster identity: a random id the cluster's first leader decides
// (node creates it at bootstrap) and the log carries in a ClusterID command.
// Servers exchange it on every Raft connection and in gossip, so that two
// clusters never exchange Raft traffic (a wiped server that bootstrapped a
// cluster of its own under an old id, say). The first ClusterID applied
// wins; later ones with another id change nothing. Snapshots carry it.

// MaxClusterIDBytes bounds a cluster id.
const MaxClusterIDBytes = 64

// ClusterID records the cluster's identity, once.
type ClusterID struct {
	// ID is 1-64 bytes of printable ASCII (0x21-0x7E).
	ID string `json:"id"`
}

// TypeClusterID is the type of a ClusterID entry.
const TypeClusterID Type = 14

func (*ClusterID) Type() Type { return TypeClusterID }

// ValidClusterID checks a cluster id: 1-64 bytes of printable ASCII
// without spaces.
func ValidClusterID(id string) *wire.Error {
	return validPrintable("cluster id", id, MaxClusterIDBytes)
}

// validPrintable checks an id (field "id", named what in the message):
// 1-maxBytes bytes of printable ASCII without spaces.
func validPrintable(what, id string, maxBytes int) *wire.Error {
	if id == "" || len(id) > maxBytes {
		return InvalidField("id", "%s must be 1-%d bytes, got %d", what, maxBytes, len(id))
	}
	for i := 0; i < len(id); i++ {
		if b := id[i]; b <= 0x20 || b > 0x7E {
			return InvalidField("id", "%s must be printable ASCII without spaces", what)
		}
	}
	return nil
}

// clusterIDCmd applies a ClusterID: the first one sets the identity; one
// with another id afterwards is refused (INVALID_ARGUMENT) and changes nothing.
func (r *registry) clusterIDCmd(c *ClusterID) Result {
	if err := ValidClusterID(c.ID); err != nil {
		return Result{Err: err}
	}
	if r.clusterID != "" && r.clusterID != c.ID {
		return Result{Err: InvalidField("id", "the cluster id is %s already", r.clusterID)}
	}
	r.clusterID = c.ID
	return Result{}
}

// ClusterID returns the cluster's identity; empty until a ClusterID
// command applied (state written before identities existed has none).
func (r *registry) ClusterID() string { return r.clusterID }

func (c *ClusterID) fields(f fields) { f.str(&c.ID) }
