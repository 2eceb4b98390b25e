package node

import "github.com/leasehold/leasehold/fsm"

// hostileConfig lets every waiter of TestHostileLoad queue.
func hostileConfig(cfg *Config, waiters int) {
	cfg.MaxWaitersPerKey = waiters
	cfg.MaxWaitersPerHolder = waiters
}

func fsmFilterAll() fsm.LeaseFilter { return fsm.LeaseFilter{} }
