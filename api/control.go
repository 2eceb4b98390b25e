package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/node"
)

// Headers of the control lease.
const (
	HeaderControlLease   = "X-Control-Lease"
	HeaderControlLeaseID = "X-Control-Lease-Id"
)

// Control lease limits and defaults.
const (
	// DefaultControlMaxMessageBytes bounds one WebSocket message.
	DefaultControlMaxMessageBytes = 4 << 10
	// DefaultControlMaxSockets bounds the open control sockets of a node.
	DefaultControlMaxSockets = 256
	// DefaultControlMaxTTL bounds the ttlMs a client may ask for.
	DefaultControlMaxTTL = node.DefaultControlMaxTTL
)

// controlForwardPath is the node-to-node route a follower sends its
// sockets' control operations to. It is served only on the node-to-node
// streams of the Raft port (node.Node.ServePeer), never on the public HTTP
// listener: no client token of any scope reaches it.
const controlForwardPath = "/v1/control/forward"

// controlBreakPath is the admin route that breaks a stuck control lease.
const controlBreakPath = "/v1/control/break"

// peerNode is implemented by nodes that carry node-to-node requests over
// their Raft port (*node.Node through FromNode or ControlFromNode).
type peerNode interface {
	ServePeer(h http.Handler)
	DialPeer(ctx context.Context, network, addr string) (net.Conn, error)
}

// ControlNode is what the control lease needs from a node; *node.Node
// (through FromNode) provides it.
type ControlNode interface {
	ControlAcquire(ctx context.Context, r node.ControlAcquireRequest) (*node.ControlState, error)
	ControlHeartbeat(ctx context.Context, holder, leaseID, token string) (*node.ControlState, error)
	ControlRelease(ctx context.Context, holder, leaseID, token, reason string) (*node.ControlState, error)
	ControlStatus(ctx context.Context, stale bool) (*node.ControlState, error)
	// ControlCheck gates a request with token and (optional) leaseID; see
	// node.Node.ControlCheck.
	ControlCheck(leaseID, token string) error
	// ControlEvent renders an event of the control lease.
	ControlEvent(ev node.Event) (name string, st *node.ControlState, ok bool)
	// ControlClock is the cluster clock in ms modulo 2^32.
	ControlClock() uint32
	// ControlBreak ends the active control lease by an admin's force; by
	// names the admin (see node.Node.ControlBreak).
	ControlBreak(ctx context.Context, by string) (*node.ControlState, error)
	Subscribe(ctx context.Context, f node.EventFilter) (Subscription, error)
}

// ControlOptions configure a Control. The zero value is usable.
type ControlOptions struct {
	// Logger receives socket failures; nil discards. Tokens are never logged.
	Logger *slog.Logger
	// Tokens enables bearer-token auth on the handlers: the socket needs the
	// write scope, the status the read scope. nil: no auth (the handlers
	// that api.New mounts are authorised by its own routes).
	Tokens *Tokens
	// MaxMessageBytes limits one WebSocket message. Default 4 KiB.
	MaxMessageBytes int64
	// MaxSockets limits the open control sockets of this node. Default 256.
	MaxSockets int
	// MaxTTL bounds the ttlMs a client may ask for. Default 1 minute.
	MaxTTL time.Duration
	// OriginPatterns are the cross-origin hosts allowed to open the socket
	// from a browser (see websocket.AcceptOptions); requests without an
	// Origin header and same-host origins are always allowed.
	OriginPatterns []string
	// ForwardTLS and ForwardDial are not used: a follower sends its
	// sockets' operations to the leader over the Raft port's node-to-node
	// streams (which have the Raft transport's mutual TLS), not over the
	// leader's HTTP API.
	ForwardTLS *tls.Config
	// See ForwardTLS.
	ForwardDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Control serves the WebSocket control lease: the protocol,
// the status route and the gate of protected routes. api.New mounts them at
// /v1/control/ws, /v1/control/status and on the admin routes; an
// application embedding a node can mount them at its own paths:
//
//	ctl := api.NewControl(api.ControlFromNode(n), api.ControlOptions{})
//	mux.Handle("GET /api/v1/control/ws", ctl.WebSocket())
//	mux.Handle("GET /api/v1/control/status", ctl.Status())
//	mux.Handle("POST /api/v1/presets", ctl.Gate(presetsHandler))
//
// On a follower the socket's operations go to the leader over the Raft
// port's node-to-node streams (node.Node.DialPeer and ServePeer; NewControl
// registers the leader's side): only servers of the cluster reach them. A
// node without such streams answers a follower's operations NO_LEADER. A
// Control is safe for concurrent use.
type Control struct {
	n       ControlNode
	log     *slog.Logger
	auth    *server // authorisation only (nil: none)
	maxMsg  int64
	maxSock int
	maxTTL  time.Duration
	origins []string

	locator leaderLocator
	client  *http.Client // to the leader's node-to-node streams; nil: none
	nodeID  string

	sockets atomic.Int64
	nextID  atomic.Uint32
	hub     controlHub
}

// NewControl returns the control lease handlers of n.
func NewControl(n ControlNode, opts ControlOptions) *Control {
	c := &Control{n: n, log: opts.Logger, maxMsg: opts.MaxMessageBytes, maxSock: opts.MaxSockets,
		maxTTL: opts.MaxTTL, origins: opts.OriginPatterns, nodeID: "follower"}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.maxMsg <= 0 {
		c.maxMsg = DefaultControlMaxMessageBytes
	}
	if c.maxSock <= 0 {
		c.maxSock = DefaultControlMaxSockets
	}
	if c.maxTTL <= 0 {
		c.maxTTL = DefaultControlMaxTTL
	}
	if opts.Tokens != nil {
		c.auth = &server{tokens: opts.Tokens, log: c.log}
	}
	if l, ok := n.(leaderLocator); ok {
		c.locator = l
		if p, ok := n.(peerNode); ok {
			c.client = &http.Client{Transport: &http.Transport{
				Proxy:                  nil,
				DialContext:            p.DialPeer,
				MaxIdleConnsPerHost:    16,
				IdleConnTimeout:        90 * time.Second,
				MaxResponseHeaderBytes: http.DefaultMaxHeaderBytes, // as the forwarder's
			}}
			p.ServePeer(c.PeerHandler())
		}
	}
	if id, ok := n.(interface{ NodeID() string }); ok {
		c.nodeID = id.NodeID()
	}
	c.hub.c = c
	return c
}

// PeerHandler returns the handler of the node-to-node requests of the
// control lease (a follower's socket operations, run on the leader). It
// must only be served where every request comes from a server of the
// cluster: NewControl registers it with the node's ServePeer.
func (c *Control) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+controlForwardPath, c.serveForward)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorBody(w, http.StatusNotFound, &node.Error{Code: node.CodeNotFound,
			Message: "no node-to-node route " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// WebSocket returns the handler of the control socket (GET, upgraded to a
// WebSocket speaking the control protocol).
func (c *Control) WebSocket() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.auth != nil && !c.auth.authorize(w, r, ScopeWrite) {
			return
		}
		c.serveSocket(w, r)
	})
}

// Status returns the handler of GET status: the seed's status object,
// never the token. Linearizable (a follower asks the leader) unless
// ?stale=true.
func (c *Control) Status() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.auth != nil && !c.auth.authorize(w, r, ScopeRead) {
			return
		}
		var st *node.ControlState
		var err error
		if isTrue(r.URL.Query().Get("stale")) {
			st, err = c.n.ControlStatus(r.Context(), true)
		} else {
			st, err = c.do(r.Context(), r, &controlOp{Op: "status"})
		}
		if err != nil {
			writeControlError(w, err, c.n.ControlClock())
			return
		}
		st.LeaseToken = ""
		writeJSON(w, http.StatusOK, st)
	})
}

// Gate returns next behind the control lease: while the control lease is
// active, a request needs its token in X-Control-Lease (428 LEASE_REQUIRED
// without it, 403 LEASE_INVALID with a wrong one, 409 CONTROL_LOCKED when
// it names another owner's lease, 409 LEASE_EXPIRED when its countdown
// reached zero). X-Control-Lease-Id is optional; with it, the token of an
// earlier lease of the caller that expired is answered LEASE_EXPIRED. The
// check reads this node's state (a follower's may lag the leader's by the
// replication delay).
func (c *Control) Gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.gate(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// gate reports whether r may pass; when not, it has answered.
func (c *Control) gate(w http.ResponseWriter, r *http.Request) bool {
	err := c.n.ControlCheck(r.Header.Get(HeaderControlLeaseID), r.Header.Get(HeaderControlLease))
	if err == nil {
		return true
	}
	writeControlError(w, err, c.n.ControlClock())
	return false
}

// controlErr is the seed's error object (REST and WebSocket), a superset
// of the contract's {"code","message",...}.
type controlErr struct {
	Code            node.Code `json:"code"`
	Message         string    `json:"message"`
	Field           string    `json:"field,omitempty"`
	OwnerClientName *string   `json:"ownerClientName,omitempty"`
	RemainingMS     *int64    `json:"remainingMs,omitempty"`
	Scope           string    `json:"scope,omitempty"`
	RequiredHeader  string    `json:"requiredHeader,omitempty"`
}

// controlErrorOf converts err into the seed's error object and its status.
func controlErrorOf(err error) (controlErr, int) {
	var ce *node.ControlError
	if errors.As(err, &ce) && ce != nil {
		e := controlErr{Code: ce.Err.Code, Message: ce.Err.Message, Field: ce.Err.Field, Scope: node.ControlScope}
		switch e.Code {
		case node.CodeControlLocked, node.CodeLeaseRequired:
			name, rem := ce.OwnerClientName, ce.RemainingMS
			e.OwnerClientName, e.RemainingMS = &name, &rem
			e.RequiredHeader = HeaderControlLease
		}
		return e, statusFor(e.Code)
	}
	ne, status, _ := toAPIError(err)
	return controlErr{Code: ne.Code, Message: ne.Message, Field: ne.Field}, status
}

// writeControlError answers a REST request with the seed's lock error
// schema: {"success":false,"error":{...},"timestamp":<cluster ms>}.
func writeControlError(w http.ResponseWriter, err error, clock uint32) {
	e, status := controlErrorOf(err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	writeJSON(w, status, struct {
		Success   bool       `json:"success"`
		Error     controlErr `json:"error"`
		Timestamp uint32     `json:"timestamp"`
	}{false, e, clock})
}

// controlOp is one control operation, run locally on the leader or sent by
// a follower to the leader's controlForwardPath.
type controlOp struct {
	Op      string                      `json:"op"` // acquire, heartbeat, release, status
	Acquire *node.ControlAcquireRequest `json:"acquire,omitempty"`
	Holder  string                      `json:"holder,omitempty"`
	LeaseID string                      `json:"leaseId,omitempty"`
	Token   string                      `json:"leaseToken,omitempty"`
	Reason  string                      `json:"reason,omitempty"`
}

// controlWire is a ControlState as the leader sends it to a follower: the
// fields the seed's objects leave out included.
type controlWire struct {
	node.ControlState
	Owner     string `json:"owner,omitempty"`
	State     string `json:"state,omitempty"`
	EndedAtMS uint32 `json:"endedAtMs,omitempty"`
	EndReason string `json:"endReason,omitempty"`
}

func (w *controlWire) state() *node.ControlState {
	st := w.ControlState
	st.Owner, st.State, st.EndedAtMS, st.EndReason = w.Owner, w.State, w.EndedAtMS, w.EndReason
	return &st
}

// local runs op on this node. The socket's bounds are checked again here
// (the node checks its own): an operation a follower sent is held to this
// node's.
func (c *Control) local(ctx context.Context, op *controlOp) (*node.ControlState, error) {
	switch op.Op {
	case "acquire":
		if op.Acquire == nil {
			return nil, &node.Error{Code: node.CodeInvalidArgument, Field: "acquire", Message: "acquire is required"}
		}
		if t := op.Acquire.TTLMS; t != 0 && (t < node.MinControlTTL.Milliseconds() || t > c.maxTTL.Milliseconds()) {
			return nil, &node.Error{Code: node.CodeInvalidArgument, Field: "ttlMs",
				Message: fmt.Sprintf("ttlMs must be %d-%d, got %d", node.MinControlTTL.Milliseconds(), c.maxTTL.Milliseconds(), t)}
		}
		if op.Acquire.HeartbeatIntervalMS < 0 {
			return nil, &node.Error{Code: node.CodeInvalidArgument, Field: "heartbeatIntervalMs",
				Message: "heartbeatIntervalMs must be positive"}
		}
		return c.n.ControlAcquire(ctx, *op.Acquire)
	case "heartbeat":
		return c.n.ControlHeartbeat(ctx, op.Holder, op.LeaseID, op.Token)
	case "release":
		return c.n.ControlRelease(ctx, op.Holder, op.LeaseID, op.Token, op.Reason)
	case "status":
		return c.n.ControlStatus(ctx, false)
	}
	return nil, &node.Error{Code: node.CodeInvalidArgument, Field: "op", Message: "unknown control operation " + op.Op}
}

// do runs op where it can be applied: here when this node leads (or no
// leader is known: the node then answers NO_LEADER), otherwise on the
// leader over a node-to-node stream (the client's own request, orig, is
// not passed on: this node authorised it).
func (c *Control) do(ctx context.Context, orig *http.Request, op *controlOp) (*node.ControlState, error) {
	if c.locator == nil {
		return c.local(ctx, op)
	}
	info, _ := c.locator.Leader()
	if info.Self || info.RaftAddr == "" {
		return c.local(ctx, op)
	}
	if c.client == nil {
		return nil, &node.Error{Code: node.CodeNoLeader, Message: "this node leads no control lease operation and has no node-to-node stream to the leader"}
	}
	body, err := json.Marshal(op)
	if err != nil {
		return nil, err
	}
	// The host is the leader's Raft address: the transport dials it with
	// DialPeer. TLS, when on, is the Raft port's own.
	u := url.URL{Scheme: "http", Host: info.RaftAddr, Path: controlForwardPath}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(headerForwarded, c.nodeID)
	resp, err := c.client.Do(req)
	if err != nil {
		if op.Op == "status" {
			return nil, &node.Error{Code: node.CodeNoLeader, Message: "the leader could not be reached: " + err.Error()}
		}
		_, e := forwardErrorStatus(req, err)
		return nil, e
	}
	defer resp.Body.Close()
	// An answer that cannot be read says nothing of the operation's fate:
	// a status is retryable (NO_LEADER), a change may have been applied
	// (INDETERMINATE).
	unreadable := func(msg string) error {
		if op.Op == "status" {
			return &node.Error{Code: node.CodeNoLeader, Message: msg + "; retry"}
		}
		return &node.Error{Code: node.CodeIndeterminate, Message: msg + "; the operation may or may not have been applied"}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, unreadable("the answer of the leader was cut: " + err.Error())
	}
	if resp.StatusCode == http.StatusOK {
		var w *controlWire
		if err := json.Unmarshal(b, &w); err != nil || w == nil {
			return nil, unreadable("undecodable answer of the leader")
		}
		if op.Op == "acquire" && (w.LeaseID == "" || w.LeaseToken == "") {
			return nil, unreadable("the leader's answer to an acquire names no lease")
		}
		return w.state(), nil
	}
	var eb struct {
		Error controlErr `json:"error"`
	}
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Code == "" {
		return nil, unreadable("undecodable error answer of the leader (" + resp.Status + ")")
	}
	ne := &node.Error{Code: eb.Error.Code, Message: eb.Error.Message, Field: eb.Error.Field}
	if eb.Error.Scope != "" {
		ce := &node.ControlError{Err: ne}
		if eb.Error.OwnerClientName != nil {
			ce.OwnerClientName = *eb.Error.OwnerClientName
		}
		if eb.Error.RemainingMS != nil {
			ce.RemainingMS = *eb.Error.RemainingMS
		}
		return nil, ce
	}
	return nil, ne
}

// serveForward answers a follower's control operation (controlForwardPath):
// served only by PeerHandler, on node-to-node streams.
func (c *Control) serveForward(w http.ResponseWriter, r *http.Request) {
	var op controlOp
	// An operation is one socket message's fields plus the holder.
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, c.maxMsg+1024))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&op); err != nil {
		writeControlError(w, decodeError(err), c.n.ControlClock())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), controlOpTimeout)
	defer cancel()
	st, err := c.local(ctx, &op)
	if err != nil {
		writeControlError(w, err, c.n.ControlClock())
		return
	}
	writeJSON(w, http.StatusOK, controlWire{ControlState: *st, Owner: st.Owner, State: st.State,
		EndedAtMS: st.EndedAtMS, EndReason: st.EndReason})
}

// controlRoutes are the routes api.New mounts when its node serves the
// control lease.
func (s *server) controlRoutes() []route {
	if s.control == nil {
		return nil
	}
	c := s.control
	return []route{
		// The control lease WebSocket.
		{"GET", "/v1/control/ws", need(ScopeWrite), func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
			c.serveSocket(w, r)
			return nil
		}},
		// The control lease's status object (never its token).
		{"GET", "/v1/control/status", need(ScopeRead), func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
			c.Status().ServeHTTP(w, r)
			return nil
		}},
		// Admin: end a stuck control lease (not behind the control lease,
		// which it breaks). Its revoked event names the admin token.
		{"POST", controlBreakPath, need(ScopeAdmin), func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
			st, err := c.n.ControlBreak(r.Context(), s.tokenName(r))
			if err != nil {
				writeControlError(w, err, c.n.ControlClock())
				return nil
			}
			st.LeaseToken = ""
			writeJSON(w, http.StatusOK, st)
			return nil
		}},
	}
}

// controlGated reports whether a route is behind the control lease: the
// mutating admin routes (any request but a GET that needs the admin scope)
// but the break of the control lease itself. Reads stay open to everyone,
// as the seed's mutability matrix says.
func controlGated(rt route, r *http.Request) bool {
	return r.Method != http.MethodGet && rt.scope(r) == ScopeAdmin && rt.path != controlBreakPath
}

// controlHub feeds control.stateChanged to every socket of this node from
// the replicated event stream, so that every node's clients see every
// change, expiry included.
type controlHub struct {
	c       *Control
	mu      sync.Mutex
	conns   map[*controlConn]struct{}
	running bool
	stop    context.CancelFunc // ends the current subscription
	// ready, while not nil, is closed once the next subscription has
	// started: a socket waits for it before it reads its first message,
	// so the events its own requests cause are never missed.
	ready chan struct{}
}

// ControlFromNode adapts an embedded *node.Node to ControlNode, for
// NewControl.
func ControlFromNode(n *node.Node) ControlNode { return nodeAdapter{n} }
