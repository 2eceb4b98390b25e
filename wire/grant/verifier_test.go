package grant

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeSource is a key set that changes, counting fetches.
type fakeSource struct {
	mu      sync.Mutex
	set     *KeySet
	err     error
	fetches int
}

func (s *fakeSource) fetch(context.Context) (*KeySet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches++
	return s.set, s.err
}

func (s *fakeSource) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

func (s *fakeSource) put(set *KeySet, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set, s.err = set, err
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestVerifierCache: the set is fetched once and kept; a grant of a kid the
// set lacks fetches it again, at most once per MinRefetch; the set is
// fetched again after MaxAge, and a key the cluster dropped then stops
// verifying; when the cluster cannot be reached the set at hand is used.
func TestVerifierCache(t *testing.T) {
	ctx := context.Background()
	k1, k2, k3 := GenerateKey(), GenerateKey(), GenerateKey()
	src := &fakeSource{set: testSet(k1)}
	clk := &fakeClock{t: at()}
	v := NewVerifier(src.fetch, VerifierOptions{VerifyOptions: VerifyOptions{Now: clk.now, IgnoreExpiry: true},
		MaxAge: time.Minute, MinRefetch: 10 * time.Second})
	g1, g2, g3 := sign(t, k1, testClaims), sign(t, k2, testClaims), sign(t, k3, testClaims)
	for range 5 {
		if _, err := v.Verify(ctx, g1); err != nil {
			t.Fatal(err)
		}
	}
	if n := src.count(); n != 1 {
		t.Fatalf("%d fetches for five grants of a known key", n)
	}
	// An unknown kid: no fetch within MinRefetch of the last one; after
	// it, one fetch, then none for MinRefetch.
	if _, err := v.Verify(ctx, g3); !errors.Is(err, ErrUnknownKey) || src.count() != 1 {
		t.Fatalf("unknown key right after a fetch: %v, %d fetches", err, src.count())
	}
	clk.add(10 * time.Second)
	for range 3 {
		if _, err := v.Verify(ctx, g3); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("unknown key: %v", err)
		}
	}
	if n := src.count(); n != 2 {
		t.Fatalf("%d fetches after unknown kids, want 2", n)
	}
	// A new key recorded (k2): found once MinRefetch has passed.
	src.put(testSet(k1, k2), nil)
	if _, err := v.Verify(ctx, g2); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("within MinRefetch: %v", err)
	}
	clk.add(11 * time.Second)
	if _, err := v.Verify(ctx, g2); err != nil {
		t.Fatalf("after MinRefetch: %v", err)
	}
	if n := src.count(); n != 3 {
		t.Fatalf("%d fetches, want 3", n)
	}
	// The cluster drops k1 (retired long ago): after MaxAge its grants fail.
	src.put(testSet(k2), nil)
	if _, err := v.Verify(ctx, g1); err != nil {
		t.Fatalf("before MaxAge: %v", err)
	}
	clk.add(time.Minute)
	if _, err := v.Verify(ctx, g1); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a dropped key after MaxAge: %v", err)
	}
	// The cluster unreachable: the set at hand verifies (offline), and the
	// failed fetch is not tried again for every grant.
	src.put(nil, errors.New("connection refused"))
	clk.add(2 * time.Minute)
	before := src.count()
	for range 3 {
		if _, err := v.Verify(ctx, g2); err != nil {
			t.Fatalf("offline: %v", err)
		}
	}
	if n := src.count() - before; n != 1 {
		t.Fatalf("%d fetches while unreachable, want 1", n)
	}
	// Malformed grants cost no fetch.
	clk.add(time.Hour)
	before = src.count()
	if _, err := v.Verify(ctx, "x.y.z"); !errors.Is(err, ErrMalformed) || src.count() != before {
		t.Fatalf("malformed: %v, %d fetches", err, src.count()-before)
	}
}

// TestVerifierNoSet: without a set, a failed fetch is the error (not a
// verification failure), and is not retried before MinRefetch.
func TestVerifierNoSet(t *testing.T) {
	ctx := context.Background()
	k := GenerateKey()
	src := &fakeSource{err: errors.New("no route to host")}
	clk := &fakeClock{t: at()}
	v := NewVerifier(src.fetch, VerifierOptions{VerifyOptions: VerifyOptions{Now: clk.now}})
	g := sign(t, k, testClaims)
	for range 3 {
		if _, err := v.Verify(ctx, g); err == nil || errors.Is(err, ErrUnknownKey) {
			t.Fatalf("no set: %v", err)
		}
	}
	if n := src.count(); n != 1 {
		t.Fatalf("%d fetches", n)
	}
	src.put(testSet(k), nil)
	clk.add(DefaultMinRefetch)
	if _, err := v.Verify(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// TestVerifierPinsCluster: the verifier keeps to the cluster of the first
// set it fetched; a later set of another cluster is refused (the set at
// hand stays), and so are grants of another cluster.
func TestVerifierPinsCluster(t *testing.T) {
	ctx := context.Background()
	k1, k2 := GenerateKey(), GenerateKey()
	src := &fakeSource{set: testSet(k1)}
	clk := &fakeClock{t: at()}
	v := NewVerifier(src.fetch, VerifierOptions{VerifyOptions: VerifyOptions{Now: clk.now}})
	if _, err := v.Verify(ctx, sign(t, k1, testClaims)); err != nil {
		t.Fatal(err)
	}
	evil := testSet(k1, k2)
	evil.ClusterID = "c-evil"
	src.put(evil, nil)
	other := testClaims
	other.ClusterID = "c-evil"
	clk.add(DefaultMinRefetch)
	if _, err := v.Verify(ctx, sign(t, k2, other)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a grant of the other cluster's key: %v", err)
	}
	if _, err := v.Verify(ctx, sign(t, k1, other)); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("a grant naming the other cluster: %v", err)
	}
	if _, err := v.Verify(ctx, sign(t, k1, testClaims)); err != nil {
		t.Fatal(err)
	}
}

// TestVerifierConcurrent: many goroutines verifying while keys rotate (for
// the race detector); each grant of a key in the set verifies.
func TestVerifierConcurrent(t *testing.T) {
	ctx := context.Background()
	keys := []ed25519.PrivateKey{GenerateKey(), GenerateKey(), GenerateKey()}
	src := &fakeSource{set: testSet(keys...)}
	v := NewVerifier(src.fetch, VerifierOptions{VerifyOptions: VerifyOptions{Now: at}, MaxAge: time.Millisecond, MinRefetch: time.Millisecond})
	var grants []string
	for _, k := range keys {
		grants = append(grants, sign(t, k, testClaims))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				if _, err := v.Verify(ctx, grants[(i+j)%len(grants)]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := NewVerifier(StaticKeys(testSet(keys[0])), VerifierOptions{VerifyOptions: VerifyOptions{Now: at}}).Verify(ctx, grants[0]); err != nil {
		t.Fatal(err)
	}
}
