package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// sickNode is a node whose Raft log cannot be written (node.HealthErr).
type sickNode struct {
	*fakeNode
	err error
}

func (s sickNode) HealthErr() error { return s.err }

// /healthz fails, with the reason, while the node cannot write its log,
// and is 200 again once it can.
func TestHealthzReportsHealthErr(t *testing.T) {
	sick := &sickNode{fakeNode: newFake(), err: errors.New(`the Raft log cannot be written (last error: "segment is sealed")`)}
	h := New(sick, Options{})
	rec := do(t, h, "GET", "/healthz", "")
	e := wantError(t, rec, 503, wire.CodeUnavailable, "")
	if !strings.Contains(e.Message, "segment is sealed") || !strings.HasPrefix(e.Message, "unhealthy: ") {
		t.Fatalf("message %q", e.Message)
	}
	sick.err = nil
	if rec := do(t, h, "GET", "/healthz", ""); rec.Code != 200 {
		t.Fatalf("healthy again: %d %s", rec.Code, rec.Body)
	}
}
