package client

import (
	"testing"

	"github.com/leasehold/leasehold/internal/godeps"
)

// TestClientLinksNoServerDependency: importing the client must not drag in
// the server (Raft, its storage, gossip, autopilot, the HTTP router, or
// our own server packages; api itself links httprouter and node).
func TestClientLinksNoServerDependency(t *testing.T) {
	forbidden := []string{
		"github.com/hashicorp/raft",
		"github.com/hashicorp/raft-boltdb",
		"github.com/hashicorp/raft-boltdb/v2",
		"github.com/hashicorp/raft-autopilot",
		"github.com/hashicorp/memberlist",
		"go.etcd.io/bbolt",
		"github.com/boltdb/bolt",
		"github.com/julienschmidt/httprouter",
		"github.com/leasehold/leasehold/node",
		"github.com/leasehold/leasehold/cluster",
		"github.com/leasehold/leasehold/fsm",
	}
	deps := godeps.Deps(t, "github.com/leasehold/leasehold/api/client")
	if len(deps) == 0 {
		t.Fatal("go list -deps printed nothing")
	}
	if bad := godeps.Forbidden(deps, forbidden); len(bad) > 0 {
		t.Errorf("api/client links server packages: %v", bad)
	}
}
