package grant

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"
)

// Fetcher returns the cluster's current key set (client.Client.Keys, or
// StaticKeys).
type Fetcher func(ctx context.Context) (*KeySet, error)

// StaticKeys is a Fetcher that always returns ks (a key set read from a
// file, for a resource that never reaches the cluster).
func StaticKeys(ks *KeySet) Fetcher {
	return func(context.Context) (*KeySet, error) { return ks, nil }
}

// Defaults of VerifierOptions.
const (
	DefaultMaxAge     = 5 * time.Minute
	DefaultMinRefetch = 10 * time.Second
)

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	VerifyOptions
	// MaxAge is how long a fetched key set is used before it is fetched
	// again, so that a key the cluster dropped stops verifying. When that
	// fetch fails the set at hand is used on (verifying offline). 0:
	// DefaultMaxAge.
	MaxAge time.Duration
	// MinRefetch bounds how often a grant whose kid the set lacks (a key
	// recorded since the last fetch, or a forgery) makes the verifier
	// fetch the set again. 0: DefaultMinRefetch.
	MinRefetch time.Duration
}

// Verifier verifies grants against a key set it fetches once and keeps:
// again after MaxAge, and when a grant names a kid the set lacks, at most
// once per MinRefetch. Without VerifyOptions.ClusterID it pins the cluster
// id of the first set it fetches and refuses a later set of another
// cluster. It is safe for concurrent use.
type Verifier struct {
	fetch Fetcher
	opts  VerifierOptions

	fetchMu sync.Mutex // one fetch at a time

	mu        sync.Mutex
	set       *KeySet
	fetchedAt time.Time // of set
	triedAt   time.Time // the last fetch, successful or not
	lastErr   error     // of the last fetch
	cluster   string    // pinned
}

// NewVerifier returns a verifier of grants against the key sets fetch
// returns.
func NewVerifier(fetch Fetcher, opts VerifierOptions) *Verifier {
	if opts.MaxAge <= 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.MinRefetch <= 0 {
		opts.MinRefetch = DefaultMinRefetch
	}
	return &Verifier{fetch: fetch, opts: opts, cluster: opts.ClusterID}
}

func (v *Verifier) now() time.Time {
	if v.opts.Now != nil {
		return v.opts.Now()
	}
	return time.Now()
}

// Verify checks grant as KeySet.Verify does, against the verifier's key
// set. A failure to fetch a set when it has none, or none of the pinned
// cluster, is returned as such (not as a verification error).
func (v *Verifier) Verify(ctx context.Context, grant string) (*Claims, error) {
	t, err := Parse(grant)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	set, stale := v.set, v.set == nil || v.now().Sub(v.fetchedAt) >= v.opts.MaxAge
	v.mu.Unlock()
	if stale {
		// A failed fetch is tried again after MinRefetch at the soonest,
		// so that an unreachable cluster does not slow every verification.
		if set, err = v.refresh(ctx, set, v.opts.MinRefetch); set == nil {
			return nil, err
		}
	}
	if _, ok := set.Key(t.KeyID); !ok {
		// A key recorded since the set was fetched, or a forgery: fetch
		// again, but not more often than MinRefetch.
		if fresh, _ := v.refresh(ctx, set, v.opts.MinRefetch); fresh != nil {
			set = fresh
		}
	}
	opts := v.opts.VerifyOptions
	opts.ClusterID = v.pinned()
	return set.verifyToken(t, opts)
}

func (v *Verifier) pinned() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cluster
}

// refresh fetches the key set unless another caller fetched it since old
// was current, or the last try was less than minGap ago. It returns the
// set to use (nil with the error when there is none).
func (v *Verifier) refresh(ctx context.Context, old *KeySet, minGap time.Duration) (*KeySet, error) {
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	v.mu.Lock()
	if v.set != old || !v.triedAt.IsZero() && v.now().Sub(v.triedAt) < minGap {
		set, err := v.set, v.lastErr
		v.mu.Unlock()
		if set == nil {
			return nil, fmt.Errorf("grant: no key set (the last fetch, less than %v ago, failed: %w)", minGap, err)
		}
		return set, nil
	}
	v.mu.Unlock()
	ks, err := v.fetch(ctx)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.triedAt = v.now()
	v.lastErr = err
	if err == nil && ks == nil {
		err = fmt.Errorf("grant: the key source returned no key set")
	}
	if err == nil && v.cluster != "" && ks.ClusterID != "" && ks.ClusterID != v.cluster {
		err = fmt.Errorf("%w: the key set fetched is cluster %q's, want %q", ErrOtherCluster, ks.ClusterID, v.cluster)
	}
	if err != nil {
		v.lastErr = err
		if v.set != nil {
			return v.set, err // verify offline with the set at hand
		}
		return nil, fmt.Errorf("grant: fetch the key set: %w", err)
	}
	v.cluster = cmp.Or(v.cluster, ks.ClusterID)
	v.set, v.fetchedAt = ks, v.triedAt
	return ks, nil
}
