package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// Limits of a keep-alive stream (POST /v1/keepalive).
const (
	// KeepAliveMaxLine bounds one renewal line, in bytes. A longer line
	// is answered with an error and ends the stream.
	KeepAliveMaxLine = 4 << 10
	// KeepAliveMaxInFlight bounds the renewals of one stream read but not
	// yet answered: beyond it the server stops reading the stream until
	// answers have been written.
	KeepAliveMaxInFlight = 1024
)

// keepAliveYields bounds how often a stream's writer yields, with no answer
// waiting and renewals in flight, before it flushes what it holds.
const keepAliveYields = 4

// keepAliveRenewals handles POST /v1/keepalive: a stream of renewals, one JSON
// object per line ({"id", "lease_id", "token", "ttl_ms"}), answered by a
// stream of one JSON object per line, each written as soon as its renewal is
// committed (so in commit order, not request order: the id matches them).
// Renewals of all streams that arrive together are committed in one Raft
// entry by the node's group commit. A line that is not a renewal is answered
// with id 0 and INVALID_ARGUMENT, and the stream goes on; a line over
// KeepAliveMaxLine ends it after the answers in flight. The stream ends when
// the client closes its side (after the last answers), when no line arrives
// within the body timeout (an empty line keeps it open), or after an answer
// NO_LEADER (this node no longer leads: the client opens a new stream, which
// is forwarded to the leader), or when the request's context ends (server
// shutdown; renewals in flight are then answered, if still possible, with
// their outcome or INDETERMINATE).
func (s *streamAPI) keepAliveRenewals(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	rc := http.NewResponseController(w) // full duplex: the route is duplex (routes.go)
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil // the client is gone
	}
	ks := &keepAliveStream{s: s.core, w: w, r: r, rc: rc, lk: s.core.lookup(r.Context(), accessOf(r), false),
		out:  make(chan *wire.KeepAliveAnswer, KeepAliveMaxInFlight+1),
		slot: make(chan struct{}, KeepAliveMaxInFlight)}
	// A cancelled request (the server shutting down) ends the stream: the
	// read blocked on the body is cut short.
	stop := context.AfterFunc(r.Context(), func() { _ = rc.SetReadDeadline(time.Now()) })
	defer stop()
	written := make(chan struct{})
	go func() {
		defer close(written)
		ks.write()
	}()
	ks.read()
	ks.wg.Wait()
	close(ks.out)
	<-written
	return nil
}

// keepAliveStream is one keep-alive stream being served.
type keepAliveStream struct {
	s  *core
	w  http.ResponseWriter
	r  *http.Request
	rc *http.ResponseController
	// lk reads a lease as the stream's token may (the same for each of
	// its renewals).
	lk *lookup
	// out carries answers to the writer; slot bounds the renewals in
	// flight (taken when a line is read, given back when it is answered).
	out  chan *wire.KeepAliveAnswer
	slot chan struct{}
	wg   sync.WaitGroup
	// ending: an answer said NO_LEADER; the reader stops.
	ending atomic.Bool
}

// read reads renewal lines until the stream ends and starts each renewal.
func (ks *keepAliveStream) read() {
	br := bufio.NewReaderSize(ks.r.Body, KeepAliveMaxLine)
	for !ks.ending.Load() {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ks.answer(&wire.KeepAliveAnswer{Status: http.StatusBadRequest, Error: &wire.Error{Code: wire.CodeInvalidArgument,
				Message: "a keep-alive line exceeds " + strconv.Itoa(KeepAliveMaxLine) + " bytes; the stream ends"}})
			return
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			ks.start(line)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && ks.r.Context().Err() == nil {
				e, status, _ := toAPIError(decodeError(err))
				ks.answer(&wire.KeepAliveAnswer{Status: status, Error: e})
			}
			return
		}
	}
}

// start decodes one line and renews its lease in the background.
func (ks *keepAliveStream) start(line []byte) {
	// One allocation per renewal: its request, answer and expiry.
	rn := new(keepAliveRenewal)
	req := &rn.req
	if parseKeepAliveLine(line, req) {
		// The Go client's usual line, read without reflection.
	} else if err := json.Unmarshal(line, req); err != nil {
		ks.answer(&wire.KeepAliveAnswer{Status: http.StatusBadRequest, Error: &wire.Error{Code: wire.CodeInvalidArgument,
			Message: "a keep-alive line must be one JSON object {\"id\", \"lease_id\", \"token\", \"ttl_ms\"}: " + err.Error()}})
		return
	}
	if req.Token == "" {
		ks.answer(&wire.KeepAliveAnswer{ID: req.ID, LeaseID: req.LeaseID, Status: http.StatusBadRequest,
			Error: &wire.Error{Code: wire.CodeInvalidArgument, Field: "token", Message: "the lease token is required"}})
		return
	}
	ks.slot <- struct{}{}
	ks.wg.Add(1)
	go ks.run(rn)
}

// keepAliveRenewal is one renewal of a stream in flight: its request and
// its answer (with the expiry the answer points to).
type keepAliveRenewal struct {
	req wire.KeepAliveRenewal
	a   wire.KeepAliveAnswer
	at  time.Time
}

// run renews rn's lease and queues its answer.
func (ks *keepAliveStream) run(rn *keepAliveRenewal) {
	defer ks.wg.Done()
	ks.renew(ks.r.Context(), rn)
	ks.out <- &rn.a
}

// renew renews one lease and makes its answer (rn.a).
func (ks *keepAliveStream) renew(ctx context.Context, rn *keepAliveRenewal) {
	req := &rn.req
	a := &rn.a
	*a = wire.KeepAliveAnswer{ID: req.ID, LeaseID: req.LeaseID}
	// A scoped token renews as POST /v1/leases/:id/renew does (scoped.go).
	sent, err := ks.lk.writeLease(req.LeaseID)
	var lease *wire.Lease
	if err == nil {
		lease, err = ks.s.n.Renew(ctx, wire.RenewRequest{LeaseID: sent, Token: req.Token, TTLMS: req.TTLMS, Metadata: req.Metadata})
		err = unhide(err, sent, req.LeaseID)
	}
	if err != nil {
		e, status, unexpected := toAPIError(err)
		if unexpected {
			ks.s.logFailure(ks.r, ks.w, err)
		}
		a.Status, a.Error = status, e
		if e.Code == wire.CodeNoLeader {
			ks.ending.Store(true)
		}
		return
	}
	rn.at = lease.ExpiresAt
	a.OK, a.FencingToken, a.TTLMS, a.RemainingMS, a.ExpiresAt, a.RenewalCount =
		true, lease.FencingToken, lease.TTLMS, lease.RemainingMS, &rn.at, lease.RenewalCount
}

// answer queues an answer that took no slot (a line that is not a renewal).
func (ks *keepAliveStream) answer(a *wire.KeepAliveAnswer) {
	ks.slot <- struct{}{}
	ks.out <- a
}

// write writes answers as they come, flushing whenever none is waiting, until
// out is closed. After a failed write it only drains (the client is gone).
func (ks *keepAliveStream) write() {
	bw := bufio.NewWriterSize(deadlineWriter{ks}, 32<<10)
	failed := false
	for a := range ks.out {
		if !failed {
			// A renewal's answer is encoded without reflection, into
			// bw's own buffer; an error's with encoding/json.
			b, ok := appendKeepAliveJSON(bw.AvailableBuffer(), a)
			if !ok {
				var err error
				if b, err = json.Marshal(a); err != nil {
					b = []byte(`{"id":` + strconv.FormatUint(a.ID, 10) + `,"ok":false,"status":500,"error":{"code":"INTERNAL","message":"internal error"}}`)
				}
			}
			bw.Write(append(b, '\n'))
		}
		<-ks.slot
		if len(ks.out) == 0 && !failed {
			// The renewals of one log entry are answered together: let
			// the others queue their answers, so that one write carries
			// them all (while renewals are in flight, up to
			// keepAliveYields times: their goroutines wake one by one).
			runtime.Gosched()
			for i := 1; i < keepAliveYields && len(ks.out) == 0 && len(ks.slot) > 0; i++ {
				runtime.Gosched()
			}
			if len(ks.out) == 0 {
				failed = ks.flush(bw) != nil
			}
		}
	}
	if !failed {
		_ = ks.flush(bw)
	}
}

// flush sends what bw holds, within the write timeout (set once: bw's
// write to the stream sets it, when bw holds anything).
func (ks *keepAliveStream) flush(bw *bufio.Writer) error {
	if bw.Buffered() == 0 {
		ks.deadline()
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return ks.rc.Flush()
}

// deadline gives the next write the whole write timeout.
func (ks *keepAliveStream) deadline() {
	if ks.s.writeTimeout > 0 {
		_ = ks.rc.SetWriteDeadline(time.Now().Add(ks.s.writeTimeout))
	}
}

// deadlineWriter writes to the stream's connection with a fresh deadline
// each time: bufio writes straight through when its buffer fills, and
// after an idle spell the deadline of the last flush is long past.
type deadlineWriter struct{ ks *keepAliveStream }

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.ks.deadline()
	return d.ks.w.Write(p)
}
