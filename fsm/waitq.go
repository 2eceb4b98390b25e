package fsm

// waitQueue is a key's queued acquires, first come first served. Every
// operation is O(1) amortized, however long the queue: a withdrawn waiter
// (timeout, cancel, its holder released) leaves a hole that is skipped and
// compacted away later, and an index by lease id finds it without a scan.
// The order of the live waiters is the only thing observable (snapshots
// encode list()), so holes never affect determinism.
type waitQueue struct {
	q    []waiter       // in arrival order; a hole has a nil Cmd
	head int            // q[:head] is consumed (all holes)
	live int            // waiters that are not holes
	pos  map[string]int // lease id -> index in q, for live waiters
}

func newWaitQueue(ws []waiter) waitQueue {
	var w waitQueue
	for _, x := range ws {
		w.push(x)
	}
	return w
}

func (w *waitQueue) len() int { return w.live }

func (w *waitQueue) push(x waiter) {
	if w.pos == nil {
		w.pos = make(map[string]int)
	}
	w.pos[x.Cmd.LeaseID] = len(w.q)
	w.q = append(w.q, x)
	w.live++
}

// front returns the first live waiter, which must exist.
func (w *waitQueue) front() waiter {
	for w.q[w.head].Cmd == nil {
		w.head++
	}
	return w.q[w.head]
}

// find returns the live waiter with lease id id.
func (w *waitQueue) find(id string) (waiter, bool) {
	i, ok := w.pos[id]
	if !ok {
		return waiter{}, false
	}
	return w.q[i], true
}

// remove withdraws the waiter with lease id id and returns it.
func (w *waitQueue) remove(id string) (waiter, bool) {
	i, ok := w.pos[id]
	if !ok {
		return waiter{}, false
	}
	x := w.q[i]
	w.q[i] = waiter{}
	delete(w.pos, id)
	w.live--
	w.compact()
	return x, true
}

// compact drops the holes once they outnumber the live waiters, so the
// queue's memory stays proportional to its live length and the work is
// paid for by the removals that made the holes.
func (w *waitQueue) compact() {
	if w.live == 0 {
		*w = waitQueue{}
		return
	}
	if holes := len(w.q) - w.live; holes <= w.live+16 {
		return
	}
	q := make([]waiter, 0, w.live+w.live/4)
	for _, x := range w.q[w.head:] {
		if x.Cmd != nil {
			w.pos[x.Cmd.LeaseID] = len(q)
			q = append(q, x)
		}
	}
	w.q, w.head = q, 0
}

// list returns the live waiters in order, in a new slice.
func (w *waitQueue) list() []waiter {
	if w.live == 0 {
		return nil
	}
	out := make([]waiter, 0, w.live)
	for _, x := range w.q[w.head:] {
		if x.Cmd != nil {
			out = append(out, x)
		}
	}
	return out
}

// frozen returns a copy of the queue for a snapshot to encode: list works
// on it, nothing else is needed (no index is built).
func (w *waitQueue) frozen() waitQueue {
	ws := w.list()
	return waitQueue{q: ws, live: len(ws)}
}
