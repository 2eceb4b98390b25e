package fsm

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestLeaseSize: the sealed token lives with the idempotency hashes, and
// metadata, lock-delay and end with the cold fields, so an active lease
// with none of them, its state a byte and its limit two, takes the
// 176-byte size class, not 192, 240 or 256 (a million leases live in
// memory).
func TestLeaseSize(t *testing.T) {
	if n := unsafe.Sizeof(Lease{}); n > 176 {
		t.Fatalf("a Lease is %d bytes, want at most 176", n)
	}
	if n := unsafe.Sizeof(leaseCold{}); n > 48 {
		t.Fatalf("a lease's cold fields are %d bytes, want at most 48", n)
	}
}

// TestSealedTokenRoundTrips: a sealed token with or without idempotency
// hashes survives a snapshot, which encodes it as before it moved (the same
// bytes restore to the same state and write the same snapshot).
func TestSealedTokenRoundTrips(t *testing.T) {
	f := New()
	f.Apply(1, &Tick{Tick: 1, PeriodMS: 100})
	f.Apply(2, &Acquire{LeaseID: "ls_a", Key: "a", Holder: "h", Limit: 1, TokenHash: HashOf("a"),
		TTLMS: 1000, TTLTicks: 10, SealedToken: []byte("sealed a")})
	f.Apply(3, &Acquire{LeaseID: "ls_b", Key: "b", Holder: "h", Limit: 1, TokenHash: HashOf("b"),
		TTLMS: 1000, TTLTicks: 10, IdemHash: HashOf("i"), Fingerprint: HashOf("fp"), SealedToken: []byte("sealed b")})
	f.Apply(4, &Acquire{LeaseID: "ls_c", Key: "c", Holder: "h", Limit: 1, TokenHash: HashOf("c"), TTLMS: 1000, TTLTicks: 10})
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g := New()
	if err := g.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"ls_a": "sealed a", "ls_b": "sealed b", "ls_c": ""} {
		if got := string(g.leases.Get(id).SealedToken()); got != want {
			t.Errorf("%s: sealed token %q, want %q", id, got, want)
		}
	}
	if g.leases.Get("ls_a").hasIdemHashes() || !g.leases.Get("ls_b").hasIdemHashes() || g.leases.Get("ls_c").idem != nil {
		t.Error("idempotency hashes not as acquired")
	}
	var again bytes.Buffer
	if _, err := g.Snapshot().WriteTo(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), buf.Bytes()) {
		t.Fatal("the restored state writes another snapshot")
	}
}
