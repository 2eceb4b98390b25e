package client

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
)

// ErrStaleToken matches (with errors.Is) every *StaleTokenError.
var ErrStaleToken = errors.New("stale fencing token")

// StaleTokenError is FenceGuard's refusal of a fencing token lower than
// one it has already seen for the key.
type StaleTokenError struct {
	Key     string
	Token   uint64 // the token refused
	Highest uint64 // the highest token seen for Key (or the eviction floor)
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("%v for %q: %d, highest seen %d", ErrStaleToken, e.Key, e.Token, e.Highest)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// FenceGuard is the resource side of fencing: it remembers the highest
// fencing token seen per key and refuses lower ones, so that a holder that
// lost its lease without noticing (paused, partitioned) cannot act after a
// newer holder has. Fencing tokens strictly increase per key, so a newer
// holder's token is always higher.
//
// Check every access with the caller's token, reads included: a newer
// holder's first read already fences the old holder off, and an old holder
// must not act on what it reads either. Check and the access it guards must
// be atomic with respect to the other accesses of that key (run both under
// the resource's own lock or transaction), or an access that passed Check
// can still land after one with a higher token.
//
// The zero value remembers every key it has seen. NewFenceGuard bounds the
// number of keys: beyond the bound the least recently checked key is
// forgotten and its highest token raises a floor that every key not
// remembered must reach. Forgetting so never lets a stale token through;
// its cost is that a holder of a forgotten or new key whose token is below
// the floor is refused and must acquire again.
//
// A FenceGuard is safe for concurrent use.
type FenceGuard struct {
	mu    sync.Mutex
	max   int // 0: unbounded
	keys  map[string]*list.Element
	lru   list.List // of *fenceEntry, most recently checked first
	floor uint64
}

type fenceEntry struct {
	key     string
	highest uint64
}

// NewFenceGuard returns a guard that remembers at most maxKeys keys (see
// FenceGuard); maxKeys <= 0 means no bound.
func NewFenceGuard(maxKeys int) *FenceGuard {
	return &FenceGuard{max: max(maxKeys, 0)}
}

// Check accepts token for key if it is at least the highest seen for key,
// and records it; otherwise it returns a *StaleTokenError (errors.Is
// ErrStaleToken) and records nothing.
func (g *FenceGuard) Check(key string, token uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	highest := g.floor
	if el, ok := g.keys[key]; ok {
		highest = el.Value.(*fenceEntry).highest
	}
	if token < highest {
		return &StaleTokenError{Key: key, Token: token, Highest: highest}
	}
	g.entry(key).highest = token
	return nil
}

// Observe records token for key without checking it: for a token learnt
// another way (from the lease service, or another replica of the resource).
// The highest seen never goes down.
func (g *FenceGuard) Observe(key string, token uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entry(key)
	e.highest = max(e.highest, token)
}

// Highest returns the lowest token Check would accept for key now: the
// highest seen for it, or, for a key not remembered, the floor left by
// forgotten keys. ok is false for a key not remembered.
func (g *FenceGuard) Highest(key string) (token uint64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if el, found := g.keys[key]; found {
		return el.Value.(*fenceEntry).highest, true
	}
	return g.floor, false
}

// entry returns key's entry, created if needed, as the most recently used
// one, forgetting the least recently used key beyond the bound.
func (g *FenceGuard) entry(key string) *fenceEntry {
	if el, ok := g.keys[key]; ok {
		g.lru.MoveToFront(el)
		return el.Value.(*fenceEntry)
	}
	if g.keys == nil {
		g.keys = make(map[string]*list.Element)
	}
	// A new key starts at the floor left by the keys forgotten before it,
	// not by the one it pushes out.
	e := &fenceEntry{key: key, highest: g.floor}
	if g.max > 0 && len(g.keys) >= g.max {
		old := g.lru.Back()
		oe := old.Value.(*fenceEntry)
		g.floor = max(g.floor, oe.highest)
		delete(g.keys, oe.key)
		g.lru.Remove(old)
	}
	g.keys[key] = g.lru.PushFront(e)
	return e
}
