package api

import (
	"bytes"
	"context"
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
	"github.com/leasehold/leasehold/wire"
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

// PeerStreams carry node-to-node requests over a node's Raft port, which
// only servers of the cluster reach (node.Node.ServePeer and DialPeer).
type PeerStreams interface {
	// ServePeer serves h on the node-to-node streams the node accepts.
	ServePeer(h http.Handler)
	// DialPeer opens a stream to the server whose Raft address is addr
	// (LeaderInfo.RaftAddr), as a net.Dialer.DialContext; a stream that
	// could not be opened is a *net.OpError with Op "dial".
	DialPeer(ctx context.Context, network, addr string) (net.Conn, error)
}

// ControlNode is what the control lease needs from a node; ControlFromNode
// adapts a *node.Node. Every method is required: a follower sends its
// sockets' operations to the leader (Locator) over the node-to-node streams
// (PeerStreams).
type ControlNode interface {
	Locator
	PeerStreams
	ControlAcquire(ctx context.Context, r node.ControlAcquireRequest) (*node.ControlState, error)
	ControlHeartbeat(ctx context.Context, holder, leaseID, token string) (*node.ControlState, error)
	ControlRelease(ctx context.Context, holder, leaseID, token, reason string) (*node.ControlState, error)
	ControlStatus(ctx context.Context, stale bool) (*node.ControlState, error)
	// ControlCheck gates a request with token and (optional) leaseID; see
	// node.Node.ControlCheck.
	ControlCheck(leaseID, token string) error
	// ControlEvent renders an event of the control lease.
	ControlEvent(ev wire.Event) (name string, st *node.ControlState, ok bool)
	// ControlClock is the cluster clock in ms modulo 2^32.
	ControlClock() uint32
	// ControlBreak ends the active control lease by an admin's force; by
	// names the admin (see node.Node.ControlBreak).
	ControlBreak(ctx context.Context, by string) (*node.ControlState, error)
	Subscribe(ctx context.Context, f wire.EventFilter) (Subscription, error)
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
// Control is safe for concurrent use.
type Control struct {
	n       ControlNode
	log     *slog.Logger
	auth    *core // authorisation only (nil: none)
	maxMsg  int64
	maxSock int
	maxTTL  time.Duration
	origins []string

	client *http.Client // to the leader's node-to-node streams

	sockets atomic.Int64
	nextID  atomic.Uint32
	hub     controlHub
}

// NewControl returns the control lease handlers of n. It panics if opts do
// not validate (ControlOptions.Validate).
func NewControl(n ControlNode, opts ControlOptions) *Control {
	if err := opts.Validate(); err != nil {
		panic(fmt.Errorf("api.NewControl: %w", err))
	}
	opts = opts.withDefaults()
	c := &Control{n: n, log: opts.Logger, maxMsg: opts.MaxMessageBytes, maxSock: opts.MaxSockets,
		maxTTL: opts.MaxTTL, origins: opts.OriginPatterns}
	if opts.Tokens != nil {
		c.auth = &core{tokens: opts.Tokens, log: c.log}
	}
	c.client = &http.Client{Transport: &http.Transport{
		Proxy:                  nil,
		DialContext:            n.DialPeer,
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: http.DefaultMaxHeaderBytes, // as the forwarder's
	}}
	n.ServePeer(c.PeerHandler())
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
		writeErrorBody(w, http.StatusNotFound, &wire.Error{Code: wire.CodeNotFound,
			Message: "no node-to-node route " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// WebSocket returns the handler of the control socket (GET, upgraded to a
// WebSocket speaking the control protocol).
func (c *Control) WebSocket() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.auth != nil {
			acc, ok := c.auth.authorize(w, r, ScopeWrite)
			if !ok {
				return
			}
			if acc != nil {
				refuseScoped(w)
				return
			}
		}
		c.serveSocket(w, r)
	})
}

// Status returns the handler of GET status: the control protocol's status object,
// never the token. Linearizable (a follower asks the leader) unless
// ?stale=true.
func (c *Control) Status() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.auth != nil {
			if _, ok := c.auth.authorize(w, r, ScopeRead); !ok {
				return
			}
		}
		var st *node.ControlState
		var err error
		q := newQuery(r)
		stale := q.stale()
		if err := q.check(); err != nil {
			writeControlError(w, err, c.n.ControlClock())
			return
		}
		if stale {
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

// controlErr is the control protocol's error object (REST and WebSocket), a superset
// of the contract's {"code","message",...}.
type controlErr struct {
	Code            wire.Code `json:"code"`
	Message         string    `json:"message"`
	Field           string    `json:"field,omitempty"`
	OwnerClientName *string   `json:"ownerClientName,omitempty"`
	RemainingMS     *int64    `json:"remainingMs,omitempty"`
	Scope           string    `json:"scope,omitempty"`
	RequiredHeader  string    `json:"requiredHeader,omitempty"`
}

// controlErrorOf converts err into the control protocol's error object and its status.
func controlErrorOf(err error) (controlErr, int) {
	var ce *node.ControlError
	if errors.As(err, &ce) && ce != nil {
		e := controlErr{Code: ce.Err.Code, Message: ce.Err.Message, Field: ce.Err.Field, Scope: node.ControlScope}
		switch e.Code {
		case wire.CodeControlLocked, wire.CodeLeaseRequired:
			name, rem := ce.OwnerClientName, ce.RemainingMS
			e.OwnerClientName, e.RemainingMS = &name, &rem
			e.RequiredHeader = HeaderControlLease
		}
		return e, statusFor(e.Code)
	}
	ne, status, _ := toAPIError(err)
	return controlErr{Code: ne.Code, Message: ne.Message, Field: ne.Field}, status
}

// writeControlError answers a REST request with the control protocol's lock error
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
// fields the control protocol's objects leave out included.
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
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "acquire", Message: "acquire is required"}
		}
		if t := op.Acquire.TTLMS; t != 0 && (t < node.MinControlTTL.Milliseconds() || t > c.maxTTL.Milliseconds()) {
			return nil, wire.OutOfRange("ttlMs", node.MinControlTTL.Milliseconds(), c.maxTTL.Milliseconds(), t, "")
		}
		if op.Acquire.HeartbeatIntervalMS < 0 {
			return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "heartbeatIntervalMs",
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
	return nil, &wire.Error{Code: wire.CodeInvalidArgument, Field: "op", Message: "unknown control operation " + op.Op}
}

// do runs op where it can be applied: here when this node leads (or no
// leader is known: the node then answers NO_LEADER), otherwise on the
// leader over a node-to-node stream (the client's own request, orig, is
// not passed on: this node authorised it).
func (c *Control) do(ctx context.Context, orig *http.Request, op *controlOp) (*node.ControlState, error) {
	info, _ := c.n.Leader()
	if info.Self || info.RaftAddr == "" {
		return c.local(ctx, op)
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
	req.Header.Set(headerForwarded, c.n.NodeID())
	resp, err := c.client.Do(req)
	if err != nil {
		if op.Op == "status" {
			return nil, &wire.Error{Code: wire.CodeNoLeader, Message: "the leader could not be reached: " + err.Error()}
		}
		// NO_LEADER when the request certainly did not reach the leader
		// (it could not be dialled); INDETERMINATE when it may have.
		if notSent(err) {
			_, e := noLeaderReach(err)
			return nil, e
		}
		_, e := indeterminateForward(err)
		return nil, e
	}
	defer resp.Body.Close()
	return controlAnswer(resp, op)
}

// controlAnswer reads the leader's answer to a follower's op: the state,
// or the leader's error. An answer that cannot be read says nothing of the
// operation's fate: a status is retryable (NO_LEADER), a change may have
// been applied (INDETERMINATE).
func controlAnswer(resp *http.Response, op *controlOp) (*node.ControlState, error) {
	unreadable := func(msg string) error {
		if op.Op == "status" {
			return &wire.Error{Code: wire.CodeNoLeader, Message: msg + "; retry"}
		}
		return &wire.Error{Code: wire.CodeIndeterminate, Message: msg + "; the operation may or may not have been applied"}
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
	ne := &wire.Error{Code: eb.Error.Code, Message: eb.Error.Message, Field: eb.Error.Field}
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

// controlSocket handles GET /v1/control/ws: the control lease WebSocket.
func (s *controlAPI) controlSocket(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	s.control.serveSocket(w, r)
	return nil
}

// controlStatus handles GET /v1/control/status: the control lease's status
// object (never its token).
func (s *controlAPI) controlStatus(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	s.control.Status().ServeHTTP(w, r)
	return nil
}

// breakControl handles POST /v1/control/break (admin): it ends a stuck
// control lease. Its revoked event names the admin token.
func (s *controlAPI) breakControl(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	c := s.control
	st, err := c.n.ControlBreak(r.Context(), s.tokenName(r))
	if err != nil {
		writeControlError(w, err, c.n.ControlClock())
		return nil
	}
	st.LeaseToken = ""
	writeJSON(w, http.StatusOK, st)
	return nil
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
