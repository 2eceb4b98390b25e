package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// writeRecords writes the same bytes whether it encodes on goroutines (a
// large group) or not, for any count around the chunk boundaries; an
// encoding error or a write error stops it with that error and leaves no
// goroutine behind.
func TestWriteRecords(t *testing.T) {
	rec := func(e *enc, i int) { e.str(fmt.Sprintf("record-%d-%s", i, strings.Repeat("x", i%7))) }
	want := func(n int) []byte {
		var b []byte
		for i := range n {
			e := enc{}
			rec(&e, i)
			b = putUvarintAppend(b, uint64(len(e.b)))
			b = append(b, e.b...)
		}
		return b
	}
	for _, n := range []int{0, 1, 2 * snapChunk, 2*snapChunk + 1, 3 * snapChunk, 7*snapChunk + 13, 20 * snapChunk} {
		var buf bytes.Buffer
		if err := writeRecords(&buf, n, nil, rec); err != nil {
			t.Fatalf("%d records: %v", n, err)
		}
		if !bytes.Equal(buf.Bytes(), want(n)) {
			t.Fatalf("%d records: %d bytes, not the records in order", n, buf.Len())
		}
	}

	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		w    *failingWriter
		enc  func(e *enc, i int)
	}{
		{"encoding", &failingWriter{after: 1 << 40}, func(e *enc, i int) {
			rec(e, i)
			if i == 9*snapChunk+5 {
				e.fail(boom)
			}
		}},
		{"writing", &failingWriter{after: 3, err: boom}, rec},
	} {
		before := runtime.NumGoroutine()
		if err := writeRecords(tc.w, 20*snapChunk, nil, tc.enc); !errors.Is(err, boom) {
			t.Errorf("%s: %v, want %v", tc.name, err, boom)
		}
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d goroutines after writeRecords, %d before", tc.name, runtime.NumGoroutine(), before)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// failingWriter fails every write after the first after ones.
type failingWriter struct {
	after int
	err   error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after == 0 {
		return 0, w.err
	}
	w.after--
	return len(p), nil
}

func putUvarintAppend(b []byte, v uint64) []byte {
	var tmp [10]byte
	return append(b, tmp[:putUvarint(tmp[:], v)]...)
}
