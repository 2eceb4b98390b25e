package chaos

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// CodeStaleFence is the fenced resource's refusal of a token below the
// highest it has seen.
const CodeStaleFence = "STALE_FENCE"

// WorkloadConfig shapes the client load.
type WorkloadConfig struct {
	// LeaseWorkers drive acquire/renew/release/read on a few keys;
	// CounterWorkers run the fenced counter. Defaults 8 and 3.
	LeaseWorkers, CounterWorkers int
	// Keys is how many lease keys are in play at once (default 3); the
	// workload moves to fresh keys every RotateEvery operations (default
	// 300) so each key's history stays small enough to check.
	Keys, RotateEvery int
	// TTLs to pick from, in ms (default 1000, 1500, 2000).
	TTLs []int64
	// OpTimeout bounds one request; a request that runs out is info.
	// Default 2.5 s.
	OpTimeout time.Duration
	// Pace is the pause between a worker's operations (default 10 ms,
	// jittered).
	Pace time.Duration
	// Prefix namespaces the keys (the run's id).
	Prefix string
	// Eps is the TTL safety fraction the holders use for their own
	// deadlines (as the checkers do).
	Eps float64
}

func (c *WorkloadConfig) defaults() {
	c.LeaseWorkers = cmp.Or(c.LeaseWorkers, 8)
	c.CounterWorkers = cmp.Or(c.CounterWorkers, 3)
	c.Keys = cmp.Or(c.Keys, 3)
	c.RotateEvery = cmp.Or(c.RotateEvery, 300)
	if len(c.TTLs) == 0 {
		c.TTLs = []int64{1000, 1500, 2000}
	}
	c.OpTimeout = cmp.Or(c.OpTimeout, 2500*time.Millisecond)
	c.Pace = cmp.Or(c.Pace, 10*time.Millisecond)
}

// classify turns a client error into an operation status.
func classify(err error) (Status, string, string) {
	if err == nil {
		return StatusOK, "", ""
	}
	var ae *client.APIError
	if errors.As(err, &ae) {
		code := string(ae.Err.Code)
		switch {
		case ae.StatusCode == http.StatusServiceUnavailable:
			// NO_LEADER: the contract says the request was not applied.
			return StatusFail, code, ""
		case ae.StatusCode >= 400 && ae.StatusCode < 500:
			return StatusFail, code, ""
		default: // 500, 502, 504 INDETERMINATE
			return StatusInfo, code, ""
		}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return StatusFail, "", "dial: " + op.Err.Error()
	}
	return StatusInfo, "", err.Error()
}

func fingerprint(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:6])
}

// clients holds one single-address client per node, so a request goes to
// exactly one node and is never retried elsewhere behind the history's
// back.
type clients []*client.Client

func newClients(c Cluster, timeout time.Duration) (clients, error) {
	out := make(clients, c.Size())
	for i := range out {
		hc := &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     5 * time.Second,
		}}
		cl, err := client.New([]string{c.HTTPAddr(i)}, client.Options{Timeout: timeout, HTTPClient: hc})
		if err != nil {
			return nil, err
		}
		out[i] = cl
	}
	return out, nil
}

// heldLease is what a worker believes it holds.
type heldLease struct {
	key, id, token string
	fence          uint64
	ttl            int64
	deadline       int64 // history time
}

// leaseWorker is one client of the lease workload.
type leaseWorker struct {
	id   int
	cfg  *WorkloadConfig
	h    *History
	cl   clients
	rng  *rand.Rand
	keys *keyRing

	proc   int
	node   int
	holder string
	held   *heldLease
	// others are lease ids seen active (for stale-token attempts);
	// retired are leases of this worker that ended (id, token).
	others  []seenLease
	retired []heldLease
}

// keyRing hands out the keys in play, moving to fresh ones every
// RotateEvery operations.
type keyRing struct {
	mu     sync.Mutex
	prefix string
	keys   int
	every  int
	n      int
}

func (k *keyRing) pick(rng *rand.Rand) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n++
	gen := k.n / k.every
	return fmt.Sprintf("%s/g%d/k%d", k.prefix, gen, rng.IntN(k.keys))
}

func (w *leaseWorker) newProcess() {
	w.proc = w.h.NewProcess()
	w.holder = fmt.Sprintf("w%d-p%d", w.id, w.proc)
	w.held = nil
}

// record fills the common fields, times the call and adds the operation.
func (w *leaseWorker) do(ctx context.Context, op Op, f func(ctx context.Context, o *Op) error) Op {
	op.Process, op.Worker, op.Node = w.proc, w.id, w.node
	op.Call = w.h.Now()
	cctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout+500*time.Millisecond)
	err := f(cctx, &op)
	cancel()
	op.Return = w.h.Now()
	op.Status, op.Code, op.Err = classify(err)
	if op.Status == StatusInfo && ctx.Err() != nil {
		// The run is over: the request was cut by the harness, not the
		// cluster. Still info: it may have been applied.
		op.Err = "cut at end of run"
	}
	w.h.Add(op)
	switch op.Status {
	case StatusInfo:
		w.newProcess()
		w.node = w.rng.IntN(len(w.cl))
	case StatusFail:
		if op.Code == "" || op.Code == string(wire.CodeNoLeader) || op.Code == string(wire.CodeUnavailable) || op.Code == string(wire.CodeOutOfService) {
			w.node = w.rng.IntN(len(w.cl))
		}
	}
	return op
}

func (w *leaseWorker) run(ctx context.Context) {
	w.newProcess()
	w.node = w.id % len(w.cl)
	for ctx.Err() == nil {
		w.step(ctx)
		pause(ctx, w.rng, w.cfg.Pace)
	}
}

func pause(ctx context.Context, rng *rand.Rand, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d/2 + time.Duration(rng.Int64N(int64(d))))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *leaseWorker) step(ctx context.Context) {
	cl := func() *client.Client { return w.cl[w.node] }
	if w.held != nil && w.h.Now() >= w.held.deadline {
		// Past our own deadline: we no longer believe we hold it.
		w.retire()
	}
	r := w.rng.Float64()
	if w.held != nil {
		l := w.held
		switch {
		case r < 0.5:
			op := w.do(ctx, Op{Kind: KRenew, Key: l.key, Holder: w.holder, LeaseID: l.id, TokenFP: fingerprint(l.token), TTLMS: l.ttl},
				func(ctx context.Context, _ *Op) error { _, err := cl().Renew(ctx, l.id, l.token, l.ttl); return err })
			if op.Status == StatusOK && w.held == l {
				l.deadline = op.Call + int64(float64(l.ttl*1e6)*(1-w.cfg.Eps))
			} else if op.Status == StatusFail && w.held == l {
				w.retire()
			}
		case r < 0.8:
			op := w.do(ctx, Op{Kind: KRelease, Key: l.key, Holder: w.holder, LeaseID: l.id, TokenFP: fingerprint(l.token)},
				func(ctx context.Context, _ *Op) error {
					_, err := cl().Release(ctx, wire.ReleaseRequest{LeaseID: l.id, Token: l.token})
					return err
				})
			if op.Status != StatusInfo && w.held == l {
				w.retire()
			}
		case r < 0.9:
			w.read(ctx, l.key)
		default:
			w.retire() // walk away: let it expire
		}
		return
	}
	key := w.keys.pick(w.rng)
	switch {
	case r < 0.6:
		ttl := w.cfg.TTLs[w.rng.IntN(len(w.cfg.TTLs))]
		var got *wire.Lease
		op := w.do(ctx, Op{Kind: KAcquire, Key: key, Holder: w.holder, TTLMS: ttl},
			func(ctx context.Context, o *Op) error {
				l, err := cl().Acquire(ctx, wire.AcquireRequest{Key: key, Holder: w.holder, TTLMS: ttl})
				if err == nil {
					got = l
					o.LeaseID, o.Fence, o.TokenFP = l.LeaseID, l.FencingToken, fingerprint(l.Token)
				}
				return err
			})
		if op.Status == StatusOK && got != nil {
			w.held = &heldLease{key: key, id: got.LeaseID, token: got.Token, fence: got.FencingToken, ttl: ttl,
				deadline: op.Call + int64(float64(ttl*1e6)*(1-w.cfg.Eps))}
		}
	case r < 0.85:
		w.read(ctx, key)
	default:
		w.staleAttempt(ctx)
	}
}

// retire forgets the held lease (keeping it for stale-token attempts).
func (w *leaseWorker) retire() {
	if w.held != nil {
		w.retired = append(w.retired, *w.held)
		if len(w.retired) > 8 {
			w.retired = w.retired[1:]
		}
	}
	w.held = nil
}

func (w *leaseWorker) read(ctx context.Context, key string) {
	op := w.do(ctx, Op{Kind: KRead, Key: key},
		func(ctx context.Context, o *Op) error {
			list, err := w.cl[w.node].List(ctx, wire.ListRequest{Key: key, State: "active", Limit: 10})
			if err == nil && len(list.Leases) > 0 {
				o.LeaseID, o.Fence = list.Leases[0].LeaseID, list.Leases[0].FencingToken
			}
			return err
		})
	if op.Status == StatusOK && op.LeaseID != "" && (w.held == nil || op.LeaseID != w.held.id) {
		w.others = append(w.others, seenLease{id: op.LeaseID, key: key})
		if len(w.others) > 8 {
			w.others = w.others[1:]
		}
	}
}

// seenLease is another client's lease a read showed active.
type seenLease struct{ id, key string }

// staleAttempt renews someone else's active lease with one of our old
// tokens, or renews one of our ended leases: both must be refused.
func (w *leaseWorker) staleAttempt(ctx context.Context) {
	if len(w.retired) == 0 {
		return
	}
	old := w.retired[w.rng.IntN(len(w.retired))]
	id, key, stale := old.id, old.key, false
	if len(w.others) > 0 && w.rng.IntN(2) == 0 {
		o := w.others[w.rng.IntN(len(w.others))]
		// Our own walked-away lease may be among the ones seen: its token
		// is then the right one.
		id, key, stale = o.id, o.key, o.id != old.id
	}
	w.do(ctx, Op{Kind: KRenew, Key: key, Holder: w.holder, LeaseID: id, TokenFP: fingerprint(old.token), Stale: stale, TTLMS: old.ttl},
		func(ctx context.Context, _ *Op) error {
			_, err := w.cl[w.node].Renew(ctx, id, old.token, old.ttl)
			return err
		})
}

// FencedResource is the protected resource of the fenced counter: it keeps
// the highest fencing token it has seen per key and refuses reads and
// writes with a lower one.
type FencedResource struct {
	mu    sync.Mutex
	max   map[string]uint64
	value map[string]int64
}

// NewFencedResource returns an empty resource.
func NewFencedResource() *FencedResource {
	return &FencedResource{max: map[string]uint64{}, value: map[string]int64{}}
}

func (r *FencedResource) admit(key string, fence uint64) bool {
	if fence < r.max[key] {
		return false
	}
	r.max[key] = fence
	return true
}

// counterWorker runs the fenced counter: acquire, read the counter with the
// token, sometimes pause beyond the TTL, write value+1 with the token,
// release.
type counterWorker struct {
	leaseWorker
	res *FencedResource
}

func (w *counterWorker) run(ctx context.Context) {
	w.newProcess()
	w.node = w.id % len(w.cl)
	for ctx.Err() == nil {
		w.cycle(ctx)
		pause(ctx, w.rng, 5*w.cfg.Pace)
	}
}

func (w *counterWorker) cycle(ctx context.Context) {
	key := fmt.Sprintf("%s/counter", w.cfg.Prefix)
	ttl := w.cfg.TTLs[0]
	var got *wire.Lease
	op := w.do(ctx, Op{Kind: KAcquire, Key: key, Holder: w.holder, TTLMS: ttl},
		func(ctx context.Context, o *Op) error {
			l, err := w.cl[w.node].Acquire(ctx, wire.AcquireRequest{Key: key, Holder: w.holder, TTLMS: ttl})
			if err == nil {
				got = l
				o.LeaseID, o.Fence, o.TokenFP = l.LeaseID, l.FencingToken, fingerprint(l.Token)
			}
			return err
		})
	if op.Status != StatusOK || got == nil {
		return
	}
	fence := got.FencingToken
	rd := w.resourceOp(KCounterRead, key, got.LeaseID, fence, 0)
	if rd.Status != StatusOK {
		w.release(ctx, key, got)
		return
	}
	if w.rng.IntN(5) == 0 {
		// A zombie: stall past the TTL without renewing, then write.
		pause(ctx, w.rng, time.Duration(ttl)*time.Millisecond*3/2)
	}
	w.resourceOp(KWrite, key, got.LeaseID, fence, rd.Value+1)
	w.release(ctx, key, got)
}

func (w *counterWorker) release(ctx context.Context, key string, l *wire.Lease) {
	w.do(ctx, Op{Kind: KRelease, Key: key, Holder: w.holder, LeaseID: l.LeaseID, TokenFP: fingerprint(l.Token)},
		func(ctx context.Context, _ *Op) error {
			_, err := w.cl[w.node].Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
			return err
		})
}

// resourceOp reads or writes the fenced resource and records it; Return is
// stamped under the resource's lock, so it orders accepted writes.
func (w *counterWorker) resourceOp(kind Kind, key, leaseID string, fence uint64, value int64) Op {
	op := Op{Process: w.proc, Worker: w.id, Node: -1, Kind: kind, Key: key, LeaseID: leaseID, Fence: fence, Value: value}
	r := w.res
	r.mu.Lock()
	op.Call = w.h.Now()
	if !r.admit(key, fence) {
		op.Status, op.Code = StatusFail, CodeStaleFence
	} else {
		op.Status = StatusOK
		if kind == KWrite {
			r.value[key] = value
		} else {
			op.Value = r.value[key]
		}
	}
	op.Return = w.h.Now()
	r.mu.Unlock()
	w.h.Add(op)
	return op
}
