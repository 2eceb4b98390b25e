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
	"github.com/leasehold/leasehold/node"
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
		out:  make(chan []*wire.KeepAliveAnswer, KeepAliveMaxInFlight+1),
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
	// out carries answers to the writer, a unit's together; slot bounds
	// the renewals in flight (taken when a line is read, given back when
	// it is answered).
	out  chan []*wire.KeepAliveAnswer
	slot chan struct{}
	wg   sync.WaitGroup
	// ending: an answer said NO_LEADER; the reader stops.
	ending atomic.Bool
}

// keepAliveUnitMax bounds the renewals of one unit: the lines read in
// together (already buffered when the first is decoded), proposed to the
// node together (one hand-off, one log entry) and answered together.
const keepAliveUnitMax = 64

// read reads renewal lines until the stream ends and starts their renewals,
// the lines already read in together as one unit.
func (ks *keepAliveStream) read() {
	br := bufio.NewReaderSize(ks.r.Body, KeepAliveMaxLine)
	var u *keepAliveUnit
	defer func() { ks.start(u) }()
	for !ks.ending.Load() {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ks.answer(&wire.KeepAliveAnswer{Status: http.StatusBadRequest, Error: &wire.Error{Code: wire.CodeInvalidArgument,
				Message: "a keep-alive line exceeds " + strconv.Itoa(KeepAliveMaxLine) + " bytes; the stream ends"}})
			return
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			u = ks.add(u, line)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && ks.r.Context().Err() == nil {
				e, status, _ := toAPIError(decodeError(err))
				ks.answer(&wire.KeepAliveAnswer{Status: status, Error: e})
			}
			return
		}
		if u != nil && (len(u.rns) >= keepAliveUnitMax || !lineBuffered(br)) {
			ks.start(u)
			u = nil
		}
	}
}

// lineBuffered reports whether br holds a whole line already read in.
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// add decodes one line into u (a new unit when nil), or answers it when it
// is not a renewal, and returns u.
func (ks *keepAliveStream) add(u *keepAliveUnit, line []byte) *keepAliveUnit {
	var req wire.KeepAliveRenewal
	if parseKeepAliveLine(line, &req) {
		// The Go client's usual line, read without reflection.
	} else if err := json.Unmarshal(line, &req); err != nil {
		ks.answer(&wire.KeepAliveAnswer{Status: http.StatusBadRequest, Error: &wire.Error{Code: wire.CodeInvalidArgument,
			Message: "a keep-alive line must be one JSON object {\"id\", \"lease_id\", \"token\", \"ttl_ms\"}: " + err.Error()}})
		return u
	}
	if req.Token == "" {
		ks.answer(&wire.KeepAliveAnswer{ID: req.ID, LeaseID: req.LeaseID, Status: http.StatusBadRequest,
			Error: &wire.Error{Code: wire.CodeInvalidArgument, Field: "token", Message: "the lease token is required"}})
		return u
	}
	ks.slot <- struct{}{}
	if u == nil {
		u = new(keepAliveUnit)
	}
	u.rns = append(u.rns, keepAliveRenewal{req: req})
	return u
}

// keepAliveUnit is renewals of a stream in flight together.
type keepAliveUnit struct {
	rns []keepAliveRenewal
}

// keepAliveRenewal is one renewal of a stream in flight: its request and
// its answer (with the expiry the answer points to).
type keepAliveRenewal struct {
	req wire.KeepAliveRenewal
	a   wire.KeepAliveAnswer
	at  time.Time
}

// start renews u's leases in the background (nothing when u is nil).
func (ks *keepAliveStream) start(u *keepAliveUnit) {
	if u == nil {
		return
	}
	ks.wg.Add(1)
	go ks.run(u)
}

// run renews u's leases and queues their answers.
func (ks *keepAliveStream) run(u *keepAliveUnit) {
	defer ks.wg.Done()
	ks.out <- ks.renew(ks.r.Context(), u)
}

// renew renews u's leases, together, and returns their answers (in rns).
func (ks *keepAliveStream) renew(ctx context.Context, u *keepAliveUnit) []*wire.KeepAliveAnswer {
	answers := make([]*wire.KeepAliveAnswer, len(u.rns))
	reqs := make([]wire.RenewRequest, 0, len(u.rns))
	// refused: the renewals the token's scope refused (scoped.go), with
	// their errors; the others are sent, in order, to RenewMany.
	refused := make([]error, len(u.rns))
	for i := range u.rns {
		req := &u.rns[i].req
		answers[i] = &u.rns[i].a
		// A scoped token renews as POST /v1/leases/:id/renew does.
		id, err := ks.lk.writeLease(req.LeaseID)
		if err != nil {
			refused[i] = err
			continue
		}
		reqs = append(reqs, wire.RenewRequest{LeaseID: id, Token: req.Token, TTLMS: req.TTLMS, Metadata: req.Metadata})
	}
	outs := make([]node.Renewed, len(reqs))
	if len(reqs) > 0 {
		ks.s.n.RenewMany(ctx, reqs, outs)
	}
	k := 0
	// logged: an unexpected failure is logged once per unit (a failed
	// entry is every renewal's error).
	logged := false
	for i := range u.rns {
		rn := &u.rns[i]
		if refused[i] != nil {
			ks.answerRenewal(rn, nil, refused[i], &logged)
			continue
		}
		ks.answerRenewal(rn, outs[k].Lease, unhide(outs[k].Err, reqs[k].LeaseID, rn.req.LeaseID), &logged)
		k++
	}
	return answers
}

// answerRenewal makes rn's answer (rn.a) from its outcome; it logs an
// unexpected failure unless *logged, and then sets it.
func (ks *keepAliveStream) answerRenewal(rn *keepAliveRenewal, lease *wire.Lease, err error, logged *bool) {
	a := &rn.a
	*a = wire.KeepAliveAnswer{ID: rn.req.ID, LeaseID: rn.req.LeaseID}
	if err != nil {
		e, status, unexpected := toAPIError(err)
		if unexpected && !*logged {
			ks.s.logFailure(ks.r, ks.w, err)
			*logged = true
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
	ks.out <- []*wire.KeepAliveAnswer{a}
}

// write writes answers as they come, flushing whenever none is waiting, until
// out is closed. After a failed write it only drains (the client is gone).
func (ks *keepAliveStream) write() {
	bw := bufio.NewWriterSize(deadlineWriter{ks}, 32<<10)
	failed := false
	for as := range ks.out {
		for _, a := range as {
			if !failed {
				// A renewal's answer is encoded without reflection,
				// into bw's own buffer; an error's with encoding/json.
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
		}
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
