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

// Service returns this server's service state and, unless it is serving,
// why. It takes no lock a stuck apply could hold.
func (n *Node) Service() (ServiceState, string) {
	if st, why := n.outState(); st != "" {
		return st, why
	}
	if err := n.HealthErr(); err != nil {
		return ServiceDiskFull, err.Error()
	}
	if n.disk.low.Load() {
		return ServiceDiskFull, "the free-space guard refuses growth: the data directory's disk is low"
	}
	if n.bk.restoreBusy(0) {
		return ServiceRestoring, "a restore is being applied"
	}
	if !n.sc.startChecked.Load() {
		return ServiceCatchingUp, "comparing this server's state with the others' (state check at start)"
	}
	if addr, _ := n.cl.Leader(); addr == "" {
		return ServiceCatchingUp, "no leader is known"
	}
	if applied, commit := n.rep.applied.Load(), n.cl.CommitIndex(); applied < commit && !n.raftOnly(applied, commit) {
		return ServiceCatchingUp, "applying the log: not caught up with the leader yet"
	}
	return ServiceServing, ""
}

// Gate is the one check every request path goes through: nil while this
// server may serve, else 503 OUT_OF_SERVICE naming the state and why. It
// costs a serving server a few atomic loads and one uncontended lock.
func (n *Node) Gate() error {
	if st, why := n.outState(); st != "" {
		return errOutOfService(st, why)
	}
	return nil
}

// outState is the state that takes this server out of service and why,
// or "" when none does; cheapest first.
func (n *Node) outState() (ServiceState, string) {
	if err := n.refusedErr(); err != nil {
		return ServiceRemoved, err.Error()
	}
	if msg := n.rep.broken.Load(); msg != nil {
		return ServiceDamaged, *msg
	}
	if msg := n.sc.diverged.Load(); msg != nil {
		return ServiceDiverged, *msg
	}
	if reason := n.applyStall(); reason != "" {
		return ServiceFrozen, reason
	}
	return "", ""
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
