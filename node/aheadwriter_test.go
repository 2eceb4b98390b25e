package node

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// aheadWriter passes every byte on, in order, whatever the sizes of the
// writes, and Close returns once they are all in.
func TestAheadWriterBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, total := range []int{0, 1, aheadBuf - 1, aheadBuf, aheadBuf + 1, 5*aheadBuf + 12345} {
		src := make([]byte, total)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		var dst bytes.Buffer
		a := newAheadWriter(&dst)
		for p := src; len(p) > 0; {
			n := min(len(p), 1+r.IntN(3*aheadBuf/2))
			if m, err := a.Write(p[:n]); m != n || err != nil {
				t.Fatalf("%d bytes: Write = %d, %v", total, m, err)
			}
			p = p[n:]
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst.Bytes(), src) {
			t.Fatalf("%d bytes: got %d bytes, not the same", total, dst.Len())
		}
	}
}

type failAfter struct {
	n   int
	err error
}

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n < len(p) {
		return 0, f.err
	}
	f.n -= len(p)
	return len(p), nil
}

// An error of the writer underneath comes back, from a later Write or from
// Close, and nothing more is written after it.
func TestAheadWriterError(t *testing.T) {
	boom := errors.New("no space left on device")
	w := &failAfter{n: 2 * aheadBuf, err: boom}
	a := newAheadWriter(w)
	chunk := make([]byte, aheadBuf/4)
	var werr error
	for range 40 {
		if _, werr = a.Write(chunk); werr != nil {
			break
		}
	}
	if err := a.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close = %v, want %v", err, boom)
	}
	if werr != nil && !errors.Is(werr, boom) {
		t.Fatalf("Write = %v, want %v", werr, boom)
	}
	if w.n != 0 {
		t.Fatalf("%d bytes of room left unwritten before the failure", w.n)
	}
}
