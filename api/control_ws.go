package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// Timeouts of a control socket.
const (
	controlOpTimeout    = 10 * time.Second
	controlWriteTimeout = 5 * time.Second
	controlPingPeriod   = 15 * time.Second
	// controlOutQueue is how many messages may wait for a slow client
	// before its socket is closed.
	controlOutQueue = 64
	// controlReleaseReason is the release reason when the client gives none.
	controlReleaseReason = "released"
)

// controlConn is one control socket. Its owner identity (holder) is
// cluster-wide unique; the lease it owns, if any, is kept in memory only.
type controlConn struct {
	c      *Control
	ws     *websocket.Conn
	req    *http.Request // the upgrade request: its Authorization is forwarded
	id     uint32
	holder string
	out    chan []byte
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	leaseID string
	token   string
}

func newHolderID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "ws_" + hex.EncodeToString(b)
}

// serveSocket upgrades r and serves the control protocol until the client
// or the node goes away. The owner's disconnect releases its lease.
func (c *Control) serveSocket(w http.ResponseWriter, r *http.Request) {
	if n := c.sockets.Add(1); n > int64(c.maxSock) {
		c.sockets.Add(-1)
		writeErrorBody(w, http.StatusServiceUnavailable, &wire.Error{Code: wire.CodeUnavailable,
			Message: fmt.Sprintf("too many control sockets open on this node (at most %d); retry later or use another node", c.maxSock)})
		return
	}
	defer c.sockets.Add(-1)
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: c.origins})
	if err != nil {
		return // Accept answered the client
	}
	ws.SetReadLimit(c.maxMsg)
	ctx, cancel := context.WithCancel(r.Context())
	cc := &controlConn{c: c, ws: ws, req: r, id: c.nextID.Add(1), holder: newHolderID(),
		out: make(chan []byte, controlOutQueue), ctx: ctx, cancel: cancel}
	c.hub.add(cc)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); cc.writer() }()
	go func() { defer wg.Done(); cc.pinger() }()
	cc.reader()
	c.hub.remove(cc)
	cancel()
	wg.Wait()
	cc.releaseOnDisconnect()
	ws.CloseNow()
}

// reader handles the client's messages one at a time until the socket ends.
func (cc *controlConn) reader() {
	for {
		typ, b, err := cc.ws.Read(cc.ctx)
		if err != nil {
			// A message over the limit closes the socket with 1009
			// (message too big) "read limited at N bytes".
			return
		}
		if typ != websocket.MessageText {
			cc.replyError("", &wire.Error{Code: wire.CodeInvalidArgument, Field: "type",
				Message: "binary messages are not part of the control protocol; send JSON text messages"})
			continue
		}
		msg, e := decodeControlMessage(b, cc.c.maxTTL.Milliseconds())
		if e != nil {
			cc.replyError(requestIDOf(b), e)
			continue
		}
		cc.handle(msg)
	}
}

// writer sends queued messages in order; a failed or slow write ends the
// socket.
func (cc *controlConn) writer() {
	for {
		select {
		case b := <-cc.out:
			ctx, cancel := context.WithTimeout(cc.ctx, controlWriteTimeout)
			err := cc.ws.Write(ctx, websocket.MessageText, b)
			cancel()
			if err != nil {
				cc.cancel()
				cc.ws.CloseNow()
				return
			}
		case <-cc.ctx.Done():
			return
		}
	}
}

// pinger detects dead peers, so their sockets do not hold slots.
func (cc *controlConn) pinger() {
	t := time.NewTicker(controlPingPeriod)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(cc.ctx, controlPingPeriod)
			err := cc.ws.Ping(ctx)
			cancel()
			if err != nil {
				cc.cancel()
				cc.ws.CloseNow()
				return
			}
		case <-cc.ctx.Done():
			return
		}
	}
}

// send queues a reply, waiting for room.
func (cc *controlConn) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	select {
	case cc.out <- b:
	case <-cc.ctx.Done():
	}
}

// broadcast queues a broadcast; a client too slow to take it is dropped.
func (cc *controlConn) broadcast(b []byte) {
	select {
	case cc.out <- b:
	case <-cc.ctx.Done():
	default:
		cc.c.log.LogAttrs(context.Background(), slog.LevelWarn, "control socket too slow; closing it",
			slog.Uint64("ws_client_id", uint64(cc.id)))
		cc.cancel()
		go cc.ws.Close(websocket.StatusPolicyViolation, "too slow to read control.stateChanged")
	}
}

// controlReply is every message the server sends.
type controlReply struct {
	Type      string      `json:"type"`
	RequestID string      `json:"requestId,omitempty"`
	Event     string      `json:"event,omitempty"`
	Success   bool        `json:"success"`
	Data      any         `json:"data,omitempty"`
	Error     *controlErr `json:"error,omitempty"`
}

// publicState is a ControlState as status and broadcasts show it: never
// with the token.
type publicState struct {
	node.ControlState
	Reason string `json:"reason,omitempty"`
}

func public(st *node.ControlState) publicState {
	p := publicState{ControlState: *st}
	p.LeaseToken = ""
	return p
}

func (cc *controlConn) replyError(requestID string, err error) {
	e, _ := controlErrorOf(err)
	e.RequiredHeader = ""
	cc.send(controlReply{Type: "error", RequestID: requestID, Success: false, Error: &e})
}

// handle runs one request of the client. A request runs to its end even
// when the socket closes meanwhile (bounded by controlOpTimeout): an
// acquire abandoned once proposed may still commit, and its lease would
// then be held by no socket until its TTL ran out; run to its end, the
// socket knows it and releases it on disconnect.
func (cc *controlConn) handle(m *controlMessage) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(cc.ctx), controlOpTimeout)
	defer cancel()
	c := cc.c
	switch m.Type {
	case "control.acquire":
		req := node.ControlAcquireRequest{Holder: cc.holder, ClientName: m.ClientName, ClientInstanceID: m.ClientInstanceID,
			WSClientID: cc.id, TTLMS: m.TTLMS, HeartbeatIntervalMS: m.HeartbeatIntervalMS}
		cc.mu.Lock()
		req.LeaseID, req.Token = cc.leaseID, cc.token
		cc.mu.Unlock()
		st, err := c.do(ctx, cc.req, &controlOp{Op: "acquire", Acquire: &req})
		if err != nil {
			cc.replyError(m.RequestID, err)
			return
		}
		cc.mu.Lock()
		cc.leaseID, cc.token = st.LeaseID, st.LeaseToken
		cc.mu.Unlock()
		cc.send(controlReply{Type: "control.acquired", RequestID: m.RequestID, Success: true, Data: st})
	case "control.heartbeat":
		st, err := c.do(ctx, cc.req, &controlOp{Op: "heartbeat", Holder: cc.holder, LeaseID: m.LeaseID, Token: m.LeaseToken})
		if err != nil {
			cc.replyError(m.RequestID, err)
			return
		}
		cc.send(controlReply{Type: "control.heartbeatAck", RequestID: m.RequestID, Success: true, Data: struct {
			LeaseID     string `json:"leaseId"`
			TTLMS       uint32 `json:"ttlMs"`
			RemainingMS uint32 `json:"remainingMs"`
			ExpiresAtMS uint32 `json:"expiresAtMs"`
		}{st.LeaseID, st.TTLMS, st.RemainingMS, st.ExpiresAtMS}})
	case "control.release":
		reason := cmp.Or(m.Reason, controlReleaseReason)
		st, err := c.do(ctx, cc.req, &controlOp{Op: "release", Holder: cc.holder, LeaseID: m.LeaseID, Token: m.LeaseToken, Reason: reason})
		if err != nil {
			cc.replyError(m.RequestID, err)
			return
		}
		cc.forget(st.LeaseID)
		cc.send(controlReply{Type: "control.released", RequestID: m.RequestID, Success: true, Data: struct {
			Released     bool   `json:"released"`
			LeaseID      string `json:"leaseId"`
			ReleasedAtMS uint32 `json:"releasedAtMs"`
			Reason       string `json:"reason"`
		}{true, st.LeaseID, st.EndedAtMS, reason}})
	case "control.status":
		st, err := c.do(ctx, cc.req, &controlOp{Op: "status"})
		if err != nil {
			cc.replyError(m.RequestID, err)
			return
		}
		cc.send(controlReply{Type: "control.status", RequestID: m.RequestID, Success: true, Data: public(st)})
	}
}

// forget drops the connection's lease credentials once that lease ended.
func (cc *controlConn) forget(leaseID string) {
	cc.mu.Lock()
	if cc.leaseID == leaseID {
		cc.leaseID, cc.token = "", ""
	}
	cc.mu.Unlock()
}

// releaseOnDisconnect releases the lease the closed connection owned. If
// the release cannot be committed now, the lease expires after its TTL.
func (cc *controlConn) releaseOnDisconnect() {
	cc.mu.Lock()
	id, tok := cc.leaseID, cc.token
	cc.leaseID, cc.token = "", ""
	cc.mu.Unlock()
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlOpTimeout)
	defer cancel()
	_, err := cc.c.do(ctx, cc.req, &controlOp{Op: "release", Holder: cc.holder, LeaseID: id, Token: tok, Reason: node.ReasonOwnerDisconnected})
	if err != nil && wire.ErrorCode(err) != wire.CodeLeaseExpired && wire.ErrorCode(err) != wire.CodeLeaseInvalid {
		cc.c.log.LogAttrs(context.Background(), slog.LevelWarn, "control lease of a closed socket not released; it expires after its TTL",
			slog.String("lease_id", id), slog.String("code", string(wire.ErrorCode(err))))
	}
}

func (h *controlHub) add(cc *controlConn) {
	h.mu.Lock()
	if h.conns == nil {
		h.conns = map[*controlConn]struct{}{}
	}
	h.conns[cc] = struct{}{}
	if !h.running {
		h.running = true
		h.ready = make(chan struct{})
		go h.run()
	}
	wait := h.ready
	h.mu.Unlock()
	if wait == nil {
		return
	}
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-wait:
	case <-t.C:
	}
}

// subscribed marks the current subscription as started (or failed).
// Called with h.mu held.
func (h *controlHub) subscribed() {
	if h.ready != nil {
		close(h.ready)
		h.ready = nil
	}
}

func (h *controlHub) remove(cc *controlConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.conns, cc)
	if len(h.conns) == 0 && h.stop != nil {
		h.stop()
		h.stop = nil
		if h.ready == nil {
			h.ready = make(chan struct{}) // the next socket waits for a new subscription
		}
	}
}

func (h *controlHub) list() []*controlConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*controlConn, 0, len(h.conns))
	for cc := range h.conns {
		out = append(out, cc)
	}
	return out
}

// closeAll ends every socket (the node shut down or the event stream
// cannot be followed); clients reconnect.
func (h *controlHub) closeAll(code websocket.StatusCode, reason string) {
	for _, cc := range h.list() {
		cc.cancel()
		go cc.ws.Close(code, reason)
	}
}

// maxHubFailures bounds consecutive failed subscriptions before every
// socket is closed.
const maxHubFailures = 10

// run follows the control lease's events while sockets are open and
// broadcasts each as control.stateChanged.
func (h *controlHub) run() {
	failures := 0
	for {
		h.mu.Lock()
		if len(h.conns) == 0 {
			h.running = false
			h.subscribed()
			h.mu.Unlock()
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		h.stop = cancel
		h.mu.Unlock()
		sub, err := h.c.n.Subscribe(ctx, wire.EventFilter{Key: node.ControlKey})
		h.mu.Lock()
		h.subscribed()
		h.mu.Unlock()
		if err == nil {
			for ev := range sub.Events() {
				failures = 0
				h.publish(ev)
			}
			err = sub.Err()
			sub.Close()
		}
		cancel()
		switch {
		case err == nil: // no sockets left, or stopped: look again
			continue
		case wire.ErrorCode(err) == wire.CodeUnavailable:
			h.closeAll(websocket.StatusGoingAway, "the node is shutting down")
		case wire.ErrorCode(err) == wire.CodeEventsCompacted:
			// History was replaced (a restore) or outran us: tell clients the
			// current state, then follow again.
			if st, err := h.c.n.ControlStatus(context.Background(), true); err == nil {
				h.send("sync", st)
			}
		}
		failures++
		if failures >= maxHubFailures {
			h.closeAll(websocket.StatusTryAgainLater, "cannot follow the control lease's events")
			h.mu.Lock()
			h.running = false
			h.subscribed()
			h.mu.Unlock()
			return
		}
		if wire.ErrorCode(err) == wire.CodeUnavailable {
			h.mu.Lock()
			h.running = false
			h.subscribed()
			h.mu.Unlock()
			return
		}
		t := time.NewTimer(time.Duration(failures) * 100 * time.Millisecond)
		<-t.C
	}
}

// publish broadcasts one event of the control lease.
func (h *controlHub) publish(ev wire.Event) {
	name, st, ok := h.c.n.ControlEvent(ev)
	if !ok {
		return
	}
	if !st.Active {
		for _, cc := range h.list() {
			cc.forget(st.LeaseID)
		}
	}
	h.send(name, st)
}

func (h *controlHub) send(name string, st *node.ControlState) {
	p := public(st)
	if !st.Active {
		p.Reason = st.EndReason
	}
	b, err := json.Marshal(controlReply{Type: "control.stateChanged", Event: name, Success: true, Data: p})
	if err != nil {
		return
	}
	for _, cc := range h.list() {
		cc.broadcast(b)
	}
}

// controlMessage is a client's message: the union of the four requests'
// fields.
type controlMessage struct {
	Type                string `json:"type"`
	RequestID           string `json:"requestId,omitempty"`
	ClientName          string `json:"clientName,omitempty"`
	ClientInstanceID    string `json:"clientInstanceId,omitempty"`
	Scope               string `json:"scope,omitempty"`
	LeaseID             string `json:"leaseId,omitempty"`
	LeaseToken          string `json:"leaseToken,omitempty"`
	Reason              string `json:"reason,omitempty"`
	TTLMS               int64  `json:"ttlMs,omitempty"`
	HeartbeatIntervalMS int64  `json:"heartbeatIntervalMs,omitempty"`
}

// Bounds of message fields.
const (
	maxRequestIDBytes  = 128
	maxLeaseTokenBytes = 128
)

// decodeControlMessage decodes one client message strictly (one JSON
// object, no unknown fields, nothing after it) and checks its fields. The
// error names the offending field.
func decodeControlMessage(b []byte, maxTTLMS int64) (*controlMessage, *wire.Error) {
	var m controlMessage
	if err := decodeStrict(b, &m); err != nil {
		return nil, err
	}
	if len(m.RequestID) > maxRequestIDBytes {
		return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "requestId",
			Message: fmt.Sprintf("requestId must be at most %d bytes", maxRequestIDBytes)}
	}
	if m.Scope != "" && m.Scope != node.ControlScope {
		return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "scope",
			Message: fmt.Sprintf("scope must be %q, the only scope in v1; got %q", node.ControlScope, m.Scope)}
	}
	switch m.Type {
	case "control.acquire":
		for _, f := range [][2]string{{"clientName", m.ClientName}, {"clientInstanceId", m.ClientInstanceID}} {
			if len(f[1]) > node.MaxControlNameBytes {
				return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: f[0],
					Message: fmt.Sprintf("%s must be at most %d bytes", f[0], node.MaxControlNameBytes)}
			}
		}
		if m.TTLMS != 0 && (m.TTLMS < 1000 || m.TTLMS > maxTTLMS) {
			return nil, wire.OutOfRange("ttlMs", 1000, maxTTLMS, m.TTLMS, "")
		}
		if m.HeartbeatIntervalMS < 0 {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "heartbeatIntervalMs",
				Message: "heartbeatIntervalMs must be positive"}
		}
	case "control.heartbeat", "control.release":
		if m.LeaseID == "" || len(m.LeaseID) > 64 {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "leaseId", Message: "leaseId is required (1-64 bytes)"}
		}
		if m.LeaseToken == "" || len(m.LeaseToken) > maxLeaseTokenBytes {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "leaseToken",
				Message: fmt.Sprintf("leaseToken is required (1-%d bytes)", maxLeaseTokenBytes)}
		}
		if len(m.Reason) > 256 {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "reason", Message: "reason must be at most 256 bytes"}
		}
		if m.Reason == node.ReasonOwnerDisconnected || m.Reason == node.ReasonTimedOut {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "reason", Message: "reason " + strconv.Quote(m.Reason) + " is reserved for the server"}
		}
	case "control.status":
	case "":
		return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "type", Message: "type is required"}
	default:
		return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "type", Message: "unknown message type " +
			strconv.Quote(truncate(m.Type, 64)) + " (want control.acquire, control.heartbeat, control.release or control.status)"}
	}
	return &m, nil
}

// decodeStrict decodes b into v: one JSON value, no unknown fields,
// nothing after it.
func decodeStrict(b []byte, v any) *wire.Error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		var extra json.RawMessage
		switch err = dec.Decode(&extra); {
		case errors.Is(err, io.EOF):
			return nil
		case err == nil:
			err = errTrailingData
		}
	}
	if errors.Is(err, io.EOF) {
		return &wire.Error{Code: wire.CodeInvalidArgument, Message: "empty message: send a JSON object"}
	}
	return decodeError(err)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// requestIDOf recovers the requestId of a message that failed to decode,
// so that the error can still be matched to its request.
func requestIDOf(b []byte) string {
	var v struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	if s, ok := v.RequestID.(string); ok && len(s) <= maxRequestIDBytes {
		return s
	}
	return ""
}
