package client

import (
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with full jitter: the delay
// before retry n (counted from 0 since the last Reset) is drawn uniformly
// from [0, min(Max, Base·2^n)]. Clients that failed at the same instant (a
// failover breaks every stream at once) so spread their retries over the
// whole window instead of coming back in lockstep.
//
// The zero value is not useful: set Base and Max (Max >= Base > 0). A
// Backoff is not safe for concurrent use; give each retry loop its own.
type Backoff struct {
	// Base is the ceiling of the first delay.
	Base time.Duration
	// Max caps the ceiling.
	Max time.Duration
	// Rand returns a uniform integer in [0, n) for n > 0. nil means
	// math/rand/v2's Int64N (safe for concurrent use); tests inject a
	// seeded or fixed source.
	Rand func(n int64) int64

	n int // retries since the last Reset
}

// Ceiling returns the upper bound of the next delay: min(Max, Base·2^n).
func (b *Backoff) Ceiling() time.Duration {
	c := b.Base
	for i := 0; i < b.n && c < b.Max; i++ {
		c *= 2
	}
	return max(min(c, b.Max), 0)
}

// Next returns the delay before the next retry, uniform in [0, Ceiling()],
// and counts the retry.
func (b *Backoff) Next() time.Duration {
	d := b.Jitter(b.Ceiling())
	b.n++
	return d
}

// Jitter returns a delay uniform in [0, d] drawn from b's random source,
// without counting a retry.
func (b *Backoff) Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Int64N
	}
	return time.Duration(rnd(int64(d) + 1))
}

// Reset starts the schedule over (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// backoffRand is the random source of this package's own backoffs (Watch,
// KeepAlive); nil, the default source, outside tests.
var backoffRand func(n int64) int64
