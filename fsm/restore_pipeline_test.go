package fsm

import (
	"bytes"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// A restore decodes leases in one goroutine while it rebuilds them in
// another (readAndRebuildLeases). With several batches of leases: the
// state restored writes the same snapshot again, and a damaged lease
// record, found by the decoder or by the rebuild after batches went
// through, fails the restore with its own error and leaves no goroutine
// behind.
func TestRestorePipeline(t *testing.T) {
	const n = 3*leaseBatch + 100
	f := New()
	fill(nil, f, n, 100000)
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	g := New()
	if err := g.Restore(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if _, err := g.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), good) {
		t.Fatal("the restored state writes another snapshot")
	}
	if g.leases.Len() != n || g.active != n {
		t.Fatalf("restored %d leases, %d active; want %d", g.leases.Len(), g.active, n)
	}

	recs, err := SplitSnapshot(good)
	if err != nil {
		t.Fatal(err)
	}
	var hdr snapHeader
	if err := decodeRecord(recs[0], "header", 0, hdr.decode); err != nil {
		t.Fatal(err)
	}
	if hdr.Keys != n || hdr.Leases != n || len(recs) != 1+2*n {
		t.Fatalf("header %+v, %d records", hdr, len(recs))
	}
	firstLease := 1 + hdr.Keys + hdr.Sessions
	late := firstLease + 3*leaseBatch + 50 // in the last batch

	// The late lease's key, dropped from the keys: the rebuild finds an
	// active lease on a key without state after three batches.
	var late1 Lease
	if err := decodeRecord(recs[late], "lease", 0, func(d *dec) { newLeaseDecoder(New()).decodeLease(d, &late1) }); err != nil {
		t.Fatal(err)
	}
	keyRecs := recs[1 : 1+hdr.Keys]
	drop := slices.IndexFunc(keyRecs, func(r []byte) bool {
		var k keyRec
		return decodeRecord(r, "key", 0, func(d *dec) { decodeKey(d, &k) }) == nil && k.key == late1.Key
	})
	if drop < 0 {
		t.Fatalf("no key record for %s", late1.Key)
	}
	noKey := slices.Delete(slices.Clone(recs), 1+drop, 2+drop)
	h := hdr
	h.Keys--
	e := enc{}
	h.encode(&e)
	noKey[0] = e.b

	swapped := slices.Clone(recs)
	swapped[late], swapped[late+1] = swapped[late+1], swapped[late]

	whole := JoinSnapshot(recs)
	for _, tc := range []struct {
		name, want string
		snap       []byte
	}{
		{"a lease on a key without state", "on key without state", JoinSnapshot(noKey)},
		{"leases out of order", "not in strictly increasing order", JoinSnapshot(swapped)},
		{"cut in the leases", "snapshot lease", whole[:len(whole)-len(recs[late])*60]},
	} {
		before := runtime.NumGoroutine()
		err := New().Restore(bytes.NewReader(tc.snap))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: restore = %v, want an error with %q", tc.name, err, tc.want)
		}
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d goroutines after the restore, %d before", tc.name, runtime.NumGoroutine(), before)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
