package node

import (
	"io"
	"sync"
)

// aheadBuf is the size of one of aheadWriter's buffers, aheadBufs how many
// there are: one being filled while the others are written.
const (
	aheadBuf  = 1 << 20
	aheadBufs = 3
)

// aheadWriter writes to w from a goroutine of its own, so that whoever
// fills it (encoding a snapshot) and the writes into w (system calls) run
// at the same time.
// Writes are buffered: an error of w comes back from a later Write or from
// Close. Close must be called, and nothing may use w until it returns.
type aheadWriter struct {
	w    io.Writer
	buf  []byte
	full chan []byte
	free chan []byte
	done chan struct{}

	mu  sync.Mutex
	err error // w's first error
}

func newAheadWriter(w io.Writer) *aheadWriter {
	a := &aheadWriter{w: w, full: make(chan []byte, aheadBufs), free: make(chan []byte, aheadBufs),
		done: make(chan struct{})}
	for range aheadBufs - 1 {
		a.free <- make([]byte, 0, aheadBuf)
	}
	a.buf = make([]byte, 0, aheadBuf)
	go a.run()
	return a
}

func (a *aheadWriter) run() {
	defer close(a.done)
	for b := range a.full {
		if a.failed() == nil {
			if _, err := a.w.Write(b); err != nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
			}
		}
		a.free <- b[:0]
	}
}

func (a *aheadWriter) failed() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Write buffers p, handing full buffers to the goroutine. It fails once
// a write into w has.
func (a *aheadWriter) Write(p []byte) (int, error) {
	if err := a.failed(); err != nil {
		return 0, err
	}
	n := len(p)
	for len(p) > 0 {
		c := copy(a.buf[len(a.buf):cap(a.buf)], p)
		a.buf, p = a.buf[:len(a.buf)+c], p[c:]
		if len(a.buf) == cap(a.buf) {
			a.full <- a.buf
			a.buf = <-a.free
		}
	}
	return n, nil
}

// Close writes what is buffered, waits for the goroutine to finish, and
// returns w's first error.
func (a *aheadWriter) Close() error {
	if len(a.buf) > 0 {
		a.full <- a.buf
		a.buf = nil
	}
	close(a.full)
	<-a.done
	return a.failed()
}
