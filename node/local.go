package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// stateHash is a state hash of the state after index.
type stateHash struct {
	index, tick uint64
	sum         string
}

// capture is the state after an index, captured in the apply path (cheap:
// records are copy-on-write, so this collects pointers) and encoded and
// hashed outside it, once for every request it answers.
type capture struct {
	snap *fsm.Snapshot
	tick uint64
	once sync.Once
	sum  string
	err  error
}

func (c *capture) hash(index uint64) (*stateHash, error) {
	c.once.Do(func() {
		h := sha256.New()
		if _, err := c.snap.WriteTo(h); err != nil {
			// Writing to a hash does not fail; an encoding error is a
			// bug that every snapshot would hit too.
			c.err = &wire.Error{Code: wire.CodeInternal, Message: "encode the state to hash it: " + err.Error()}
			return
		}
		c.sum = hex.EncodeToString(h.Sum(nil))
		c.snap = nil
	})
	if c.err != nil {
		return nil, c.err
	}
	return &stateHash{index: index, tick: c.tick, sum: c.sum}, nil
}

type hashReq struct {
	at   uint64
	done chan hashResult // buffered: the apply path never waits for the reader
}

// hashResult answers a request: the captured state, or an error.
type hashResult struct {
	c   *capture
	err error
}

func (res hashResult) hash(at uint64) (*stateHash, error) {
	if res.err != nil {
		return nil, res.err
	}
	return res.c.hash(at)
}

// hashAt registers a request for the hash after index at and waits for it.
// A request is registered before the position is read, and the apply path
// stores the position before it looks for requests (both sequentially
// consistent), so either the request sees the entry applied or the apply
// path sees the request: none is left waiting for an entry already passed.
func (r *replica) hashAt(ctx context.Context, at uint64) (*stateHash, error) {
	req := &hashReq{at: at, done: make(chan hashResult, 1)}
	r.hashMu.Lock()
	r.hashes = append(r.hashes, req)
	r.hashWant.Add(1)
	pos := r.pos.Load()
	if pos >= at {
		r.dropHash(req)
		r.hashMu.Unlock()
		if pos == at {
			// The state is still the one right after at, unless an
			// apply got in since: check under the apply lock.
			r.mu.RLock()
			var c *capture
			if r.pos.Load() == at {
				c = r.capture()
			}
			r.mu.RUnlock()
			if c != nil {
				return c.hash(at)
			}
		}
		return nil, r.passedErr(at, "")
	}
	r.hashMu.Unlock()
	select {
	case res := <-req.done:
		return res.hash(at)
	case <-ctx.Done():
	}
	r.hashMu.Lock()
	served := !r.dropHash(req)
	r.hashMu.Unlock()
	if served {
		return (<-req.done).hash(at)
	}
	if ctx.Err() == context.Canceled {
		return nil, ctx.Err()
	}
	return nil, &wire.Error{Code: wire.CodeUnavailable, AppliedIndex: r.applied.Load(),
		Message: fmt.Sprintf("index %d was not applied in time (applied index %d)", at, r.applied.Load())}
}

// dropHash removes req from the pending requests (hashMu held) and reports
// whether it was still there.
func (r *replica) dropHash(req *hashReq) bool {
	i := slices.Index(r.hashes, req)
	if i < 0 {
		return false
	}
	r.hashes = slices.Delete(r.hashes, i, i+1)
	r.hashWant.Add(-1)
	return true
}

// serveHashes answers the pending requests for indexes up to upTo with the
// current state, which is the state right after each of them. Called in the
// apply path with mu held.
func (r *replica) serveHashes(upTo uint64) {
	r.hashMu.Lock()
	defer r.hashMu.Unlock()
	var c *capture
	r.hashes = slices.DeleteFunc(r.hashes, func(req *hashReq) bool {
		if req.at > upTo {
			return false
		}
		if c == nil {
			c = r.capture()
		}
		req.done <- hashResult{c: c}
		r.hashWant.Add(-1)
		return true
	})
}

// failHashes answers the pending requests for indexes up to upTo, which a
// snapshot install jumped over (mu held).
func (r *replica) failHashes(upTo uint64) {
	r.hashMu.Lock()
	defer r.hashMu.Unlock()
	r.hashes = slices.DeleteFunc(r.hashes, func(req *hashReq) bool {
		if req.at > upTo {
			return false
		}
		req.done <- hashResult{err: r.passedErr(req.at, " (a snapshot was installed over it)")}
		r.hashWant.Add(-1)
		return true
	})
}

func (r *replica) passedErr(at uint64, why string) *wire.Error {
	pos := r.pos.Load()
	return &wire.Error{Code: wire.CodeIndexPassed, AppliedIndex: pos,
		Message: fmt.Sprintf("this node is past index %d%s: applied index %d; ask for a later index", at, why, pos)}
}

// capture captures the current state (mu held, for reading at least).
func (r *replica) capture() *capture {
	return &capture{snap: r.f.Snapshot(), tick: r.f.Tick()}
}
