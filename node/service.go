package node

import (
	"sync"

	"github.com/leasehold/leasehold/wire"
)

// The service gate. A server is in one service state at a time; some of
// them take it out of service, and then it answers no request from its
// state and commits nothing: every request path goes through Gate (the
// API's routes but health, readiness, metrics, local state and the
// membership repairs; and in here propose, readBarrier with stale reads,
// Subscribe and running subscriptions, so the control lease's socket
// too). The refusal is 503 OUT_OF_SERVICE with the state and the reason:
// a client tries another server (the Go client does), the request was not
// applied.

// ServiceState names this server's service state.
type ServiceState string

// The service states, in the order Service looks for them: the first that
// holds is the state.
const (
	// ServiceRemoved: the cluster removed this server (or its id belongs
	// to another cluster). Out of service.
	ServiceRemoved ServiceState = "removed"
	// ServiceDamaged: its log holds a committed entry it cannot apply.
	// Out of service.
	ServiceDamaged ServiceState = "damaged"
	// ServiceDiverged: a state check found its state different from the
	// cluster's. Out of service.
	ServiceDiverged ServiceState = "diverged"
	// ServiceFrozen: a follower whose applied index stands still while the
	// cluster goes on (stall.go). Out of service: what it would answer
	// grows staler without bound.
	ServiceFrozen ServiceState = "frozen"
	// ServiceDiskFull: the log cannot be written, or the free-space guard
	// refuses growth. Serving (releases free space; reads answer).
	ServiceDiskFull ServiceState = "disk_full"
	// ServiceRestoring: a restore is being committed or applied. Serving.
	ServiceRestoring ServiceState = "restoring"
	// ServiceCatchingUp: not ready yet (no leader known, not caught up, the
	// state check at start not over). Serving what it can.
	ServiceCatchingUp ServiceState = "catching_up"
	// ServiceServing: none of the above.
	ServiceServing ServiceState = "serving"
)

// OutOfService reports whether state s takes a server out of service.
func (s ServiceState) OutOfService() bool {
	switch s {
	case ServiceRemoved, ServiceDamaged, ServiceDiverged, ServiceFrozen:
		return true
	}
	return false
}

func errOutOfService(s ServiceState, reason string) *wire.Error {
	return &wire.Error{Code: wire.CodeOutOfService, ServiceState: string(s),
		Message: "this server is out of service (" + string(s) + "): " + reason + "; try another server"}
}

// outSignal is fired when this server takes itself out of service for
// good (diverged): running subscriptions end then.
type outSignal struct {
	once sync.Once
	ch   chan struct{}
}

func newOutSignal() *outSignal { return &outSignal{ch: make(chan struct{})} }

func (o *outSignal) fire() { o.once.Do(func() { close(o.ch) }) }
