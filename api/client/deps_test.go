package client

import (
	"cmp"
	"strings"
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

// codeNeedsGo is the Go language version the module's own code builds
// with (checked with go build -gcflags='github.com/leasehold/leasehold/...=-lang=goX'
// and the stdlib APIs it calls): raise it when the code starts using a
// newer language feature or standard library API.
const codeNeedsGo = "1.25"

// TestGoDirectiveIsTheFloor: go.mod's go line is what every program
// importing the client must be built with, so it is the least version that
// builds: the highest of the dependencies' go lines and of what the code
// itself needs, never a patch release above .0 (a patch release adds no
// language feature or API; naming one only forces every importer onto it).
// The project's own toolchain, if pinned, belongs on a toolchain line.
func TestGoDirectiveIsTheFloor(t *testing.T) {
	var main string
	floor, from := codeNeedsGo, "the code itself (codeNeedsGo)"
	for _, m := range godeps.Modules(t) {
		switch {
		case m.Main:
			main = m.GoVersion
		case m.GoVersion != "" && compareGo(m.GoVersion, floor) > 0:
			floor, from = m.GoVersion, m.Path
		}
	}
	if main == "" {
		t.Fatal("go list -m all named no main module with a go line")
	}
	if _, patch := splitGo(main); patch > 0 {
		t.Errorf("go.mod says go %s, a patch release: every program importing the client must then use Go >= %s", main, main)
	}
	if compareGo(main, floor) > 0 {
		t.Errorf("go.mod says go %s, above what is needed: go %s (%s)", main, floor, from)
	}
}

// splitGo splits a go line's version "1.N" or "1.N.P" into N and P (0
// when absent; pre-release suffixes are ignored).
func splitGo(v string) (minor, patch int) {
	parts := strings.SplitN(v, ".", 3)
	num := func(s string) int {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	if len(parts) > 1 {
		minor = num(parts[1])
	}
	if len(parts) > 2 {
		patch = num(parts[2])
	}
	return minor, patch
}

// compareGo compares two Go 1.x versions by minor, then patch release.
func compareGo(a, b string) int {
	am, ap := splitGo(a)
	bm, bp := splitGo(b)
	return cmp.Or(cmp.Compare(am, bm), cmp.Compare(ap, bp))
}
