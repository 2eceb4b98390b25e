package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// streamErrorEvent is the SSE event type of the last message of a stream the
// node ended with an error (for example a subscriber too slow to keep up).
// Its data is an error body; the client may resume with Last-Event-ID.
const streamErrorEvent = "stream_error"

// events handles GET /v1/events: a Server-Sent Events stream of changes.
//
// Filters: key, prefix, holder. Position: the Last-Event-ID header (what an
// EventSource sends when it reconnects) wins over ?after_index=N (after
// every event of that Raft index); ?from=start replays the history the node
// keeps; neither means only new events. 410 EVENTS_COMPACTED when the
// history no longer reaches back that far.
//
// Each event is written as "id: <event id>", "event: <type>", "data: <JSON
// event>" and flushed; an idle stream gets a comment line every keep-alive
// interval. The stream ends when the client goes away, when the request
// context is cancelled, or when the node ends the subscription (then with a
// final stream_error event if it ended on an error).
func (s *streamAPI) events(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	f, err := eventFilter(r)
	if err != nil {
		return err
	}
	release, err := s.streams.acquire(r)
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.n.Subscribe(r.Context(), f)
	if err != nil {
		return err
	}
	defer sub.Close()

	rc := http.NewResponseController(w)
	// A stream outlives any write timeout of the server.
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return nil
	}
	s.stream(w, r, rc, sub, accessOf(r))
	return nil
}

// eventFilter reads the filters and the position of GET /v1/events.
func eventFilter(r *http.Request) (wire.EventFilter, error) {
	q := newQuery(r)
	f := wire.EventFilter{
		Key:        q.str("key"),
		Prefix:     q.str("prefix"),
		Holder:     q.str("holder"),
		AfterIndex: q.integer("after_index"),
	}
	switch from := q.str("from"); from {
	case "", "now":
	case "start":
		f.FromStart = true
	default:
		return f, &wire.Error{Code: wire.CodeInvalidArgument, Field: "from",
			Message: `from must be "start" or "now"`}
	}
	if err := q.check(); err != nil {
		return f, err
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		f.After, f.AfterIndex = id, 0
	}
	return f, nil
}

// stream writes the events of sub to the client of r, with a comment line
// every keep-alive interval, until the client goes away, the request
// context ends or the subscription does (then with a final stream_error
// event if it ended on an error). A scoped token's stream (a not nil)
// leaves out what the token may not see (visibleEvent).
func (s *streamAPI) stream(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, sub Subscription, a *access) {
	keepAlive := time.NewTicker(s.keepAlive)
	defer keepAlive.Stop()
	events := sub.Events()
	var buf []byte
	unflushed := false
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-events:
			if !ok {
				if err := sub.Err(); err != nil {
					e, _, _ := toAPIError(err)
					buf = appendSSE(buf[:0], "", streamErrorEvent, errorBody{Error: e})
					_, _ = w.Write(buf)
					_ = rc.Flush()
				}
				return
			}
			if ev, ok = s.visibleEvent(r.Context(), a, ev); ok {
				buf = appendSSE(buf[:0], ev.ID, ev.Type, scrubEvent(ev))
				if _, err := w.Write(buf); err != nil {
					return
				}
				unflushed = true
			}
			// Flush once the burst is written: every event reaches the
			// client as soon as nothing else is immediately pending.
			if unflushed && len(events) == 0 {
				if rc.Flush() != nil {
					return
				}
				unflushed = false
			}
		case <-keepAlive.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// appendSSE appends one SSE message: optional id, event type, data as one
// line of JSON, and the blank line that ends it.
func appendSSE(buf []byte, id, typ string, data any) []byte {
	b, err := json.Marshal(data)
	if err != nil {
		b = []byte(`{"error":{"code":"INTERNAL","message":"internal error"}}`)
	}
	if id != "" {
		buf = append(buf, "id: "...)
		buf = append(buf, id...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	return append(buf, "\n\n"...)
}

// scrubEvent makes sure no secret token leaves in an event, whatever the
// node put in it.
func scrubEvent(ev wire.Event) wire.Event {
	if ev.Lease != nil && ev.Lease.Token != "" {
		l := *ev.Lease
		l.Token = ""
		ev.Lease = &l
	}
	if ev.Session != nil && ev.Session.Token != "" {
		ss := *ev.Session
		ss.Token = ""
		ev.Session = &ss
	}
	return ev
}
