package api

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/leasehold/leasehold/internal/option"
	"github.com/leasehold/leasehold/node"
)

// Options configure the handler of New. DefaultOptions has every default
// filled in; in the zero value (and in any field left zero) each field
// means its default as well: no logging, auth off, 64 KiB bodies, 15 s
// keep-alives.
type Options struct {
	// Logger receives request failures and admin actions; nil discards.
	Logger *slog.Logger
	// Tokens enables bearer-token auth; nil turns auth off.
	Tokens *Tokens
	// MaxBodyBytes limits request bodies, in bytes. Default
	// DefaultMaxBodyBytes (64 KiB).
	MaxBodyBytes int64
	// KeepAlive is the interval of comment lines on idle event streams.
	// Default DefaultKeepAlive (15 s).
	KeepAlive time.Duration
	// ForwardTLS is the client side of TLS for forwarding to the leader
	// (the leader's certificate is verified against its RootCAs, and its
	// client certificate answers a leader that requires one). When set,
	// requests are forwarded over https; nil: over http, unless the request
	// itself came over TLS, then https with the system roots.
	ForwardTLS *tls.Config
	// ForwardDial, if set, opens the connections a follower forwards
	// requests to the leader over (embedders with a custom network; the
	// chaos suite injects faults through it). Nil: TCP with a 2 s timeout.
	ForwardDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ForwardTimeout bounds a request a follower forwards to the leader
	// (an acquire: its wait_ms plus this). A forward is also abandoned as
	// soon as another node leads. A write cut short so is answered 504
	// INDETERMINATE, or 503 NO_LEADER when none of it was sent; a read is
	// tried again on the new leader. Snapshot transfers have no deadline.
	// Default DefaultForwardTimeout (3 s).
	ForwardTimeout time.Duration
	// BodyTimeout is how long a client has to send a request body (for a
	// snapshot upload: between two reads); the answer to a late one is 400.
	// Requests without a body, event streams among them, are not bounded.
	// Default DefaultBodyTimeout (30 s); negative: no limit.
	BodyTimeout time.Duration
	// WriteTimeout bounds how long an answer may take to be written, from
	// the request's arrival (a client that does not read its answers
	// cannot hold a connection and its buffers for ever). It does not
	// apply to event streams, control WebSockets and snapshot transfers; a
	// local acquire gets its wait_ms on top. Default DefaultWriteTimeout
	// (30 s); negative: no limit.
	WriteTimeout time.Duration
	// MaxStreamsPerClient bounds the event streams one client address has
	// open at once (429 RESOURCE_EXHAUSTED beyond). Default
	// DefaultMaxStreamsPerClient (128); negative: no limit. The node bounds
	// the total (node.Config.MaxEventStreams).
	MaxStreamsPerClient int
	// Control configures the control lease routes (served when the node's
	// ControlLease is not nil, as FromNode's is not); its Tokens and Logger
	// are ignored (the API's own apply). Default DefaultControlOptions().
	Control ControlOptions
}

// DefaultOptions returns the options of a server with every default filled
// in: no logging, auth off, forwarding over plain TCP.
func DefaultOptions() Options {
	return Options{
		MaxBodyBytes:        DefaultMaxBodyBytes,
		KeepAlive:           DefaultKeepAlive,
		ForwardTimeout:      DefaultForwardTimeout,
		BodyTimeout:         DefaultBodyTimeout,
		WriteTimeout:        DefaultWriteTimeout,
		MaxStreamsPerClient: DefaultMaxStreamsPerClient,
		Control:             DefaultControlOptions(),
	}
}

// Validate reports every problem with the options at once (nil: none). New
// panics on options that do not validate.
func (o Options) Validate() error {
	var errs []error
	errs = negative(errs, "max body bytes", o.MaxBodyBytes, DefaultMaxBodyBytes)
	errs = negative(errs, "keep-alive interval", o.KeepAlive, DefaultKeepAlive)
	errs = negative(errs, "forward timeout", o.ForwardTimeout, DefaultForwardTimeout)
	if err := o.Control.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("control: %w", err))
	}
	return errors.Join(errs...)
}

// withDefaults returns o with every zero field set to its default and the
// negative "no limit"s of the timeouts and the stream limit set to 0, the
// server's "none"; the control lease's options are NewControl's to fill.
func (o Options) withDefaults() Options {
	def := DefaultOptions()
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, def.MaxBodyBytes)
	o.KeepAlive = cmp.Or(o.KeepAlive, def.KeepAlive)
	o.ForwardTimeout = cmp.Or(o.ForwardTimeout, def.ForwardTimeout)
	o.BodyTimeout = option.OrNone(o.BodyTimeout, def.BodyTimeout)
	o.WriteTimeout = option.OrNone(o.WriteTimeout, def.WriteTimeout)
	o.MaxStreamsPerClient = option.OrNone(o.MaxStreamsPerClient, def.MaxStreamsPerClient)
	return o
}

// negative adds to errs that the option what, v, is negative (def is its
// default, meant by 0).
func negative[T int | int64 | time.Duration](errs []error, what string, v, def T) []error {
	if v < 0 {
		errs = append(errs, fmt.Errorf("%s %v is negative (0: the default, %v)", what, v, def))
	}
	return errs
}

// ControlOptions configure a Control. DefaultControlOptions has every
// default filled in; in the zero value (and in any field left zero) each
// field means its default as well.
type ControlOptions struct {
	// Logger receives socket failures; nil discards. Tokens are never logged.
	Logger *slog.Logger
	// Tokens enables bearer-token auth on the handlers: the socket needs the
	// write scope, the status the read scope. nil: no auth (the handlers
	// that api.New mounts are authorised by its own routes).
	Tokens *Tokens
	// MaxMessageBytes limits one WebSocket message, in bytes. Default
	// DefaultControlMaxMessageBytes (4 KiB).
	MaxMessageBytes int64
	// MaxSockets limits the open control sockets of this node. Default
	// DefaultControlMaxSockets (256).
	MaxSockets int
	// MaxTTL bounds the ttlMs a client may ask for. Default
	// DefaultControlMaxTTL (1 minute); at least node.MinControlTTL.
	MaxTTL time.Duration
	// OriginPatterns are the cross-origin hosts allowed to open the socket
	// from a browser (see websocket.AcceptOptions); requests without an
	// Origin header and same-host origins are always allowed. Default none.
	//
	// A follower sends its sockets' operations to the leader over the Raft
	// port's node-to-node streams (which have the Raft transport's mutual
	// TLS), not over the leader's HTTP API: Options.ForwardTLS and
	// ForwardDial do not apply to them.
	OriginPatterns []string
}

// DefaultControlOptions returns the options of a control lease with every
// default filled in: no logging, no auth of its own.
func DefaultControlOptions() ControlOptions {
	return ControlOptions{
		MaxMessageBytes: DefaultControlMaxMessageBytes,
		MaxSockets:      DefaultControlMaxSockets,
		MaxTTL:          DefaultControlMaxTTL,
	}
}

// Validate reports every problem with the options at once (nil: none).
// NewControl panics on options that do not validate.
func (o ControlOptions) Validate() error {
	var errs []error
	errs = negative(errs, "max message bytes", o.MaxMessageBytes, DefaultControlMaxMessageBytes)
	errs = negative(errs, "max sockets", o.MaxSockets, DefaultControlMaxSockets)
	errs = negative(errs, "max TTL", o.MaxTTL, DefaultControlMaxTTL)
	if o.MaxTTL > 0 && o.MaxTTL < node.MinControlTTL {
		errs = append(errs, fmt.Errorf("max TTL %v is below the shortest TTL a client may ask for, %v", o.MaxTTL, node.MinControlTTL))
	}
	return errors.Join(errs...)
}

// withDefaults returns o with every zero field set to its default.
func (o ControlOptions) withDefaults() ControlOptions {
	def := DefaultControlOptions()
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, def.MaxMessageBytes)
	o.MaxSockets = cmp.Or(o.MaxSockets, def.MaxSockets)
	o.MaxTTL = cmp.Or(o.MaxTTL, def.MaxTTL)
	return o
}
