package fsm

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"
)

// warmSink keeps what encodeChunk's warm read, so that the reads are not
// left out.
var warmSink atomic.Uint32

// snapChunk is how many records one encoding job of writeRecords covers;
// snapWorkers is how many goroutines encode a large group of records, and
// snapInflight how many chunks may be encoded ahead of the one written.
const (
	snapChunk    = 4096
	snapWorkers  = 2
	snapInflight = 4
)

// writeRecords writes n records to w, each its length and then what
// encode(e, i) encodes for i = 0..n-1, in that order. A group of more than
// two chunks is encoded by snapWorkers goroutines, a chunk at a time, and
// written in order: a snapshot visits its records in name order, not in
// the order they sit in memory, so encoding a million of them is mostly
// waiting on memory, and two goroutines wait on it at once. encode must
// only read what it encodes.
func writeRecords(w io.Writer, n int, warm func(lo, hi int) byte, encode func(e *enc, i int)) error {
	if n <= 2*snapChunk {
		buf, err := encodeChunk(nil, 0, n, warm, encode)
		if err == nil && len(buf) > 0 {
			_, err = w.Write(buf)
		}
		return err
	}
	type result struct {
		buf []byte
		err error
	}
	type job struct {
		lo, hi int
		out    chan result // buffered: a worker never waits to hand in
	}
	// pending carries each job's result channel in order; a job is
	// dispatched only once its channel is in pending, so at most
	// snapInflight chunks are held beyond the one being written.
	pending := make(chan chan result, snapInflight)
	jobs := make(chan job, snapInflight)
	free := make(chan []byte, snapInflight+1) // written buffers, for reuse
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(pending)
		defer close(jobs)
		for lo := 0; lo < n; lo += snapChunk {
			j := job{lo: lo, hi: min(n, lo+snapChunk), out: make(chan result, 1)}
			select {
			case pending <- j.out:
			case <-stop:
				return
			}
			select {
			case jobs <- j:
			case <-stop:
				return
			}
		}
	}()
	for range snapWorkers {
		go func() {
			for j := range jobs {
				var buf []byte
				select {
				case buf = <-free:
				default:
				}
				buf, err := encodeChunk(buf[:0], j.lo, j.hi, warm, encode)
				j.out <- result{buf, err}
			}
		}()
	}
	for out := range pending {
		r := <-out
		if r.err != nil {
			return r.err
		}
		if _, err := w.Write(r.buf); err != nil {
			return err
		}
		select {
		case free <- r.buf:
		default:
		}
	}
	return nil
}

// encodeChunk appends records lo..hi-1 (writeRecords) to buf. warm, if
// not nil, first reads what encoding records lo..hi-1 will read, in a
// loop of nothing else: the records' memory is fetched many lines at a
// time instead of one miss after another in the middle of encoding.
func encodeChunk(buf []byte, lo, hi int, warm func(lo, hi int) byte, encode func(e *enc, i int)) ([]byte, error) {
	if warm != nil {
		warmSink.Add(uint32(warm(lo, hi)))
	}
	e := enc{b: make([]byte, 0, 1024)}
	for i := lo; i < hi; i++ {
		e.b = e.b[:0]
		encode(&e, i)
		if e.err != nil {
			return buf, e.err
		}
		if len(e.b) > maxSnapRecord {
			return buf, fmt.Errorf("fsm: snapshot record of %d bytes", len(e.b))
		}
		buf = binary.AppendUvarint(buf, uint64(len(e.b)))
		buf = append(buf, e.b...)
	}
	return buf, nil
}
