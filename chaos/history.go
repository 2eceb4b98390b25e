package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Kind is what an operation did.
type Kind string

// The operations of the workloads.
const (
	// Lease operations (the lease workload and the fenced counter).
	KAcquire Kind = "acquire"
	KRenew   Kind = "renew"
	KRelease Kind = "release"
	// KRead is a linearizable read of the key's active lease.
	KRead Kind = "read"
	// KWrite and KCounterRead act on the fenced resource in the harness.
	KWrite       Kind = "write"
	KCounterRead Kind = "counter-read"
	// KTick is a linearizable read of the cluster clock (GET /v1/cluster):
	// Value is the tick, PeriodMS the tick period.
	KTick Kind = "tick"
	// KRestore is an operator's restore of a snapshot file saved earlier
	// in the run (the restore-under-load scenario). Restored names, per
	// key, the lease the file has active there: the restore brings it
	// back, with a new fencing token, if the key is free at the restore;
	// a key in use keeps its lease (see node.Node.RestoreSnapshot).
	KRestore Kind = "restore"
)

// Status is how an operation ended.
type Status string

// An operation succeeded (ok), definitely failed without effect (fail), or
// its effect is unknown (info: a timeout, a cut connection, INDETERMINATE).
const (
	StatusOK   Status = "ok"
	StatusFail Status = "fail"
	StatusInfo Status = "info"
)

// Op is one client operation of a history. Times are nanoseconds since the
// run started, on the harness's monotonic clock, which orders the whole
// history (every client lives in the harness process).
type Op struct {
	// Process identifies the logical client; it moves to a fresh number
	// after an info operation (its effect may still happen at any later
	// time, so the same process must not be reused).
	Process int    `json:"process"`
	Worker  int    `json:"worker"`
	Node    int    `json:"node"`
	Kind    Kind   `json:"kind"`
	Key     string `json:"key"`
	Holder  string `json:"holder,omitempty"`
	// LeaseID is the lease acted on (renew, release), granted (acquire
	// ok) or seen active (read ok; "" when the key is free).
	LeaseID string `json:"lease_id,omitempty"`
	// TokenFP is a fingerprint of the lease token sent or granted, never
	// the token itself; Stale marks a deliberately wrong token.
	TokenFP string `json:"token_fp,omitempty"`
	Stale   bool   `json:"stale,omitempty"`
	TTLMS   int64  `json:"ttl_ms,omitempty"`
	// Fence is the fencing token granted (acquire ok), seen (read ok) or
	// presented to the fenced resource (write).
	Fence uint64 `json:"fence,omitempty"`
	// Value is the counter value read or written (fenced counter), or the
	// tick read (KTick).
	Value    int64 `json:"value,omitempty"`
	PeriodMS int64 `json:"period_ms,omitempty"`
	// Restored is what a KRestore brings back: key -> the lease id the
	// file has active on it.
	Restored map[string]string `json:"restored,omitempty"`

	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	Status Status `json:"status"`
	// Code is the contract error code of a failure ("" for transport
	// errors, which carry Err).
	Code string `json:"code,omitempty"`
	Err  string `json:"err,omitempty"`
}

// Event is a nemesis action or an observation (a leader change) in the
// same stream as the operations.
type Event struct {
	Time int64 `json:"time"`
	// Type is "nemesis" or "leader" or "note".
	Type string `json:"type"`
	// Name is the fault ("partition", "kill", ...) or the leader's id.
	Name string `json:"name"`
	// Phase is "start" or "stop" for a nemesis window.
	Phase  string `json:"phase,omitempty"`
	Detail string `json:"detail,omitempty"`
	Err    string `json:"err,omitempty"`
	// NoQuorum marks a nemesis window in which no healthy majority
	// exists: the liveness checker excuses the clock for standing still
	// in it (not for longer than its bound after it).
	NoQuorum bool `json:"no_quorum,omitempty"`
}

// record is one line of history.jsonl: exactly one field is set.
type record struct {
	Op    *Op    `json:"op,omitempty"`
	Event *Event `json:"event,omitempty"`
}

// History collects operations and events, and streams them to a JSONL file
// as they complete. It is safe for concurrent use.
type History struct {
	start time.Time

	mu     sync.Mutex
	ops    []Op
	events []Event
	w      *bufio.Writer
	f      io.Closer
	werr   error
	procs  int
}

// NewHistory starts a history whose clock starts now. path, if not empty,
// receives every record as a JSON line.
func NewHistory(path string) (*History, error) {
	h := &History{start: time.Now()}
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("chaos: history: %w", err)
		}
		h.f, h.w = f, bufio.NewWriter(f)
	}
	return h, nil
}

// Now is the time since the history started, in nanoseconds.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Start is the wall time the history's clock started.
func (h *History) Start() time.Time { return h.start }

// NewProcess hands out a fresh process number.
func (h *History) NewProcess() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.procs++
	return h.procs - 1
}

// Add records a completed operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	h.write(record{Op: &op})
}

// Note records an event at the current time.
func (h *History) Note(e Event) {
	if e.Time == 0 {
		e.Time = h.Now()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
	h.write(record{Event: &e})
}

func (h *History) write(r record) {
	if h.w == nil || h.werr != nil {
		return
	}
	b, err := json.Marshal(r)
	if err == nil {
		b = append(b, '\n')
		_, err = h.w.Write(b)
	}
	h.werr = err
}

// Ops returns a copy of the operations recorded so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Events returns a copy of the events recorded so far.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// Close flushes and closes the JSONL file.
func (h *History) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil {
		return nil
	}
	err := h.werr
	if e := h.w.Flush(); err == nil {
		err = e
	}
	if e := h.f.Close(); err == nil {
		err = e
	}
	h.w = nil
	return err
}

// ReadHistory loads a history.jsonl written by a History.
func ReadHistory(path string) ([]Op, []Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var ops []Op
	var evs []Event
	dec := json.NewDecoder(bufio.NewReader(f))
	for {
		var r record
		if err := dec.Decode(&r); err == io.EOF {
			return ops, evs, nil
		} else if err != nil {
			return nil, nil, fmt.Errorf("chaos: %s: %w", path, err)
		}
		switch {
		case r.Op != nil:
			ops = append(ops, *r.Op)
		case r.Event != nil:
			evs = append(evs, *r.Event)
		}
	}
}
