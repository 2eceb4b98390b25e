package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

func TestReadSSE(t *testing.T) {
	stream := ": keep-alive\r\n" +
		"id: 1-0\r\nevent: acquired\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n" +
		"retry: 100\n\n" + // no data: nothing dispatched
		"data:x\n\n" + // id persists from the previous event
		"id: 2-0\ndata: y\n\n"
	type ev struct{ id, event, data string }
	var got []ev
	err := readSSE(strings.NewReader(stream), func(id, event string, data []byte) error {
		got = append(got, ev{id, event, string(data)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []ev{{"1-0", "acquired", "{\"a\":\n1}"}, {"1-0", "", "x"}, {"2-0", "", "y"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if err := readSSE(strings.NewReader("data: half"), func(string, string, []byte) error { return nil }); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated stream: err = %v", err)
	}
}

func sse(w http.ResponseWriter, ev wire.Event) {
	data, _ := json.Marshal(ev)
	fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, data)
	w.(http.Flusher).Flush()
}

func TestWatchResumesAfterLastEvent(t *testing.T) {
	for _, ending := range []string{"broken stream", "stream_error event"} {
		t.Run(ending, func(t *testing.T) { testWatchResumes(t, ending == "stream_error event") })
	}
}

func testWatchResumes(t *testing.T, streamError bool) {
	var conns atomic.Int64
	lastIDs := make(chan string, 4)
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.URL.Query().Get("prefix") != "jobs/" {
			t.Errorf("unexpected request %s", r.URL)
		}
		lastIDs <- r.Header.Get("Last-Event-ID")
		w.Header().Set("Content-Type", "text/event-stream")
		switch conns.Add(1) {
		case 1:
			sse(w, wire.Event{ID: "5-0", Index: 5, Type: "acquired"})
			sse(w, wire.Event{ID: "5-1", Index: 5, Type: "released"})
			if streamError {
				fmt.Fprintf(w, "event: stream_error\ndata: {\"error\":{\"code\":\"UNAVAILABLE\",\"message\":\"too slow\"}}\n\n")
			}
			// then the stream ends
		default:
			sse(w, wire.Event{ID: "7-0", Index: 7, Type: "expired"})
			<-r.Context().Done()
		}
	})
	c := newClient(t, s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	reconnects := 0
	done := errors.New("done")
	err := c.Watch(ctx, WatchOptions{Prefix: "jobs/", LastEventID: "4-0", OnReconnect: func(error, time.Duration) { reconnects++ }},
		func(ev wire.Event) error {
			got = append(got, ev.ID+" "+ev.Type)
			if len(got) == 3 {
				return done
			}
			return nil
		})
	if !errors.Is(err, done) {
		t.Fatalf("err = %v, want the callback's error", err)
	}
	if want := "[5-0 acquired 5-1 released 7-0 expired]"; fmt.Sprint(got) != want {
		t.Errorf("events %v, want %s", got, want)
	}
	if a, b := <-lastIDs, <-lastIDs; a != "4-0" || b != "5-1" {
		t.Errorf("Last-Event-ID sent %q then %q, want 4-0 then 5-1", a, b)
	}
	if reconnects != 1 {
		t.Errorf("reconnects = %d, want 1", reconnects)
	}
}

func TestWatchStopsOnCompacted(t *testing.T) {
	s, cnt := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("after_index") != "3" {
			t.Errorf("after_index = %q", r.URL.Query().Get("after_index"))
		}
		writeErr(w, http.StatusGone, wire.CodeEventsCompacted, "history starts at 10")
	})
	c := newClient(t, s.URL)
	err := c.Watch(context.Background(), WatchOptions{AfterIndex: 3}, func(wire.Event) error { return nil })
	if ErrorCode(err) != wire.CodeEventsCompacted || StatusCode(err) != http.StatusGone {
		t.Fatalf("err = %v, want 410 EVENTS_COMPACTED", err)
	}
	if cnt.n.Load() != 1 {
		t.Errorf("requests = %d, want 1", cnt.n.Load())
	}
}

func TestWatchStopsOnCompactedStreamError(t *testing.T) {
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("from") != "start" {
			t.Errorf("from = %q", r.URL.Query().Get("from"))
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: stream_error\ndata: {\"error\":{\"code\":\"EVENTS_COMPACTED\",\"message\":\"gone\"}}\n\n")
	})
	c := newClient(t, s.URL)
	err := c.Watch(context.Background(), WatchOptions{FromStart: true}, func(wire.Event) error { return nil })
	if ErrorCode(err) != wire.CodeEventsCompacted {
		t.Fatalf("err = %v, want EVENTS_COMPACTED", err)
	}
}

func TestWatchEndsWithContext(t *testing.T) {
	started := make(chan struct{})
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	})
	c := newClient(t, s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Watch(ctx, WatchOptions{}, func(wire.Event) error { return nil }) }()
	<-started
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
}

// TestWatchRetriesTooManyStreams: a reconnect refused with 429
// RESOURCE_EXHAUSTED (the server still counts the broken stream) is retried
// with backoff, not the end of the watch.
func TestWatchRetriesTooManyStreams(t *testing.T) {
	var conns atomic.Int64
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		switch conns.Add(1) {
		case 1:
			w.Header().Set("Content-Type", "text/event-stream")
			sse(w, wire.Event{ID: "5-0", Index: 5, Type: "acquired"})
		case 2:
			writeErr(w, http.StatusTooManyRequests, wire.CodeResourceExhausted, "too many streams")
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			sse(w, wire.Event{ID: "6-0", Index: 6, Type: "released"})
			<-r.Context().Done()
		}
	})
	c := newClient(t, s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	var reasons []error
	done := errors.New("done")
	err := c.Watch(ctx, WatchOptions{OnReconnect: func(err error, _ time.Duration) { reasons = append(reasons, err) }},
		func(ev wire.Event) error {
			if got = append(got, ev.ID); len(got) == 2 {
				return done
			}
			return nil
		})
	if !errors.Is(err, done) || fmt.Sprint(got) != "[5-0 6-0]" {
		t.Fatalf("err %v, events %v", err, got)
	}
	if len(reasons) != 2 || ErrorCode(reasons[1]) != wire.CodeResourceExhausted {
		t.Fatalf("reconnects %v, want a broken stream then 429", reasons)
	}
}
