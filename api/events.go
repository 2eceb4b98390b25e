package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/node"
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
func (s *server) events(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	f := node.EventFilter{
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
		return &node.Error{Code: node.CodeInvalidArgument, Field: "from",
			Message: `from must be "start" or "now"`}
	}
	if err := q.check(); err != nil {
		return err
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		f.After, f.AfterIndex = id, 0
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

	keepAlive := time.NewTicker(s.keepAlive)
	defer keepAlive.Stop()
	events := sub.Events()
	var buf []byte
	for {
		select {
		case <-r.Context().Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				if err := sub.Err(); err != nil {
					e, _, _ := toAPIError(err)
					buf = appendSSE(buf[:0], "", streamErrorEvent, errorBody{Error: e})
					_, _ = w.Write(buf)
					_ = rc.Flush()
				}
				return nil
			}
			buf = appendSSE(buf[:0], ev.ID, ev.Type, scrubEvent(ev))
			if _, err := w.Write(buf); err != nil {
				return nil
			}
			// Flush once the burst is written: every event reaches the
			// client as soon as nothing else is immediately pending.
			if len(events) == 0 && rc.Flush() != nil {
				return nil
			}
		case <-keepAlive.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil || rc.Flush() != nil {
				return nil
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
func scrubEvent(ev node.Event) node.Event {
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
