package node

import (
	"sync"

	"github.com/leasehold/leasehold/fsm"
)

// waitList is the acquires waiting on this server for the state machine's
// answer (granted, or their wait ended), by lease id.
type waitList struct {
	mu sync.Mutex
	m  map[string][]chan fsm.Notice
}

// deliver passes each notice to the acquires waiting for its lease.
func (w *waitList) deliver(ns []fsm.Notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, no := range ns {
		for _, ch := range w.m[no.LeaseID] {
			select {
			case ch <- no:
			default:
			}
		}
		delete(w.m, no.LeaseID)
	}
}

// add registers a listener for id.
func (w *waitList) add(id string) chan fsm.Notice {
	ch := make(chan fsm.Notice, 1)
	w.mu.Lock()
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch
}

// drop removes one listener for id and returns how many remain.
func (w *waitList) drop(id string, ch chan fsm.Notice) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.m[id]
	for i, c := range list {
		if c == ch {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.m, id)
	} else {
		w.m[id] = list
	}
	return len(list)
}

// has reports whether ch still listens for id.
func (w *waitList) has(id string, ch chan fsm.Notice) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.m[id] {
		if c == ch {
			return true
		}
	}
	return false
}
