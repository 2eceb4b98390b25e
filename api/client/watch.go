package client

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// WatchOptions selects the events of a Watch and where it starts.
type WatchOptions struct {
	// Key, Prefix and Holder filter events; empty matches everything.
	Key, Prefix, Holder string
	// LastEventID resumes strictly after this event id (sent as
	// Last-Event-ID).
	LastEventID string
	// AfterIndex resumes after every event of this Raft index; used only
	// when LastEventID is empty.
	AfterIndex uint64
	// FromStart replays the history the node keeps (?from=start); used
	// only when neither LastEventID nor AfterIndex is set. None of the
	// three: only new events.
	FromStart bool
	// OnReconnect, if set, is called before each reconnection with the
	// reason and the delay before it.
	OnReconnect func(err error, delay time.Duration)
}

const (
	watchMinBackoff = 100 * time.Millisecond
	watchMaxBackoff = 5 * time.Second
)

// Watch streams events (GET /v1/events, Server-Sent Events) to fn, in order,
// until ctx ends (it returns ctx's error), fn returns an error (returned as
// is), or a node refuses the stream with a 4xx answer such as 410
// EVENTS_COMPACTED (an *APIError). If the stream cannot be opened on any
// address at first, that error is returned. After that, a broken stream, a
// transport failure, a 5xx answer or a stream_error event (other than
// EVENTS_COMPACTED) makes Watch reconnect with backoff, resuming after the
// last event delivered, so fn sees each event once. The backoff has full
// jitter (see Backoff: 100 ms doubling up to 5 s, from 100 ms again after a
// stream that opened), so watchers broken by the same failover do not
// reconnect in lockstep; a server's Retry-After is waited out first, with
// the jittered delay on top.
// fn runs on Watch's goroutine; a slow fn slows the stream.
func (c *Client) Watch(ctx context.Context, opts WatchOptions, fn func(wire.Event) error) error {
	last := opts.LastEventID
	backoff := Backoff{Base: watchMinBackoff, Max: watchMaxBackoff, Rand: backoffRand}
	everOpened := false
	for {
		opened, err := c.watchOnce(ctx, opts, &last, fn)
		everOpened = everOpened || opened
		var fe fnError
		var ae *APIError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &fe):
			return fe.err
		case !everOpened:
			return err
		case errors.As(err, &ae) && ae.StatusCode/100 == 4 && ae.StatusCode != http.StatusTooManyRequests:
			// 429 (too many streams open, say while the server has not
			// yet noticed the one that broke) is worth waiting out.
			return err
		case err == nil:
			err = io.ErrUnexpectedEOF
		}
		if opened {
			backoff.Reset()
		}
		delay := backoff.Next()
		if ae != nil && ae.RetryAfter > 0 {
			// Every client told to come back after Retry-After would come
			// back together: the jitter goes on top.
			delay += ae.RetryAfter
		}
		if opts.OnReconnect != nil {
			opts.OnReconnect(err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// fnError marks an error returned by the caller's callback.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// watchOnce opens one stream and reads it until it ends. opened reports
// whether a node accepted the stream; err is nil when the server closed the
// stream cleanly.
func (c *Client) watchOnce(ctx context.Context, opts WatchOptions, last *string, fn func(wire.Event) error) (opened bool, err error) {
	q := url.Values{}
	for k, v := range map[string]string{"key": opts.Key, "prefix": opts.Prefix, "holder": opts.Holder} {
		if v != "" {
			q.Set(k, v)
		}
	}
	h := http.Header{"Accept": {"text/event-stream"}}
	if *last != "" {
		h.Set("Last-Event-ID", *last)
	} else if opts.AfterIndex > 0 {
		q.Set("after_index", strconv.FormatUint(opts.AfterIndex, 10))
	} else if opts.FromStart {
		q.Set("from", "start")
	}
	resp, cancel, err := c.send(ctx, call{method: http.MethodGet, path: "/v1/events", query: q, header: h, retry: retrySafe, stream: true})
	if err != nil {
		return false, err
	}
	defer cancel()
	defer resp.Body.Close()
	return true, readSSE(resp.Body, func(id, event string, data []byte) error {
		if event == "stream_error" || event == "error" {
			return decodeStreamError(data)
		}
		var ev wire.Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("client: decode event: %w", err)
		}
		ev.ID = cmp.Or(ev.ID, id)
		if err := fn(ev); err != nil {
			return fnError{err}
		}
		if ev.ID != "" {
			*last = ev.ID
		}
		return nil
	})
}

func decodeStreamError(data []byte) error {
	var env struct {
		Error *wire.Error `json:"error"`
	}
	if json.Unmarshal(data, &env) == nil && env.Error != nil {
		status := http.StatusInternalServerError
		if env.Error.Code == wire.CodeEventsCompacted {
			status = http.StatusGone
		}
		return &APIError{StatusCode: status, Err: env.Error}
	}
	return fmt.Errorf("client: stream error: %s", data)
}

// readSSE parses a text/event-stream and calls dispatch for every event with
// data. It returns nil at a clean end of stream, or the first error from
// reading or from dispatch.
func readSSE(r io.Reader, dispatch func(id, event string, data []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		id, event string
		data      []byte
		hasData   bool
	)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				if line == "" {
					return nil
				}
				return io.ErrUnexpectedEOF
			}
			return err
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if hasData {
				if err := dispatch(id, event, data); err != nil {
					return err
				}
			}
			event, data, hasData = "", data[:0], false
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue // comment / keep-alive
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			if !strings.ContainsRune(value, 0) {
				id = value
			}
		case "event":
			event = value
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		}
	}
}
