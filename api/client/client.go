package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// DefaultTimeout bounds one attempt of a request when Options.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// Options configures a Client. The zero value is usable.
type Options struct {
	// Token is the bearer token sent as "Authorization: Bearer <token>";
	// empty sends none (a server with auth off accepts that).
	Token string
	// HTTPClient performs the requests; nil means a client with its own
	// pooled transport. Its Timeout, if set, also cuts event streams short,
	// so prefer Options.Timeout.
	HTTPClient *http.Client
	// Timeout bounds each attempt of a non-streaming request (an acquire
	// that waits for a slot gets its wait_ms on top). 0 means
	// DefaultTimeout; negative means no bound besides the context.
	Timeout time.Duration
	// StaleReads answers reads from the node contacted (?stale=true)
	// instead of linearizably through the leader.
	StaleReads bool
	// ControlLease, if set, is sent as X-Control-Lease on admin routes
	// (needed while a control lease gates them).
	ControlLease string
	// TLSConfig, if set, is used for https (with the client's own
	// transport; ignored when HTTPClient is set), and "host:port"
	// addresses mean https://host:port.
	TLSConfig *tls.Config
}

// Client is a Leasehold HTTP client. It is safe for concurrent use.
type Client struct {
	addrs   []string // base URLs, no trailing slash
	opts    Options
	hc      *http.Client
	timeout time.Duration
	// next is the index of the address tried first: the last one that
	// answered.
	next atomic.Int64
}

// New returns a client for the given node addresses. An address is
// "host:port" (http is assumed) or a base URL such as "https://host:port".
func New(addrs []string, opts Options) (*Client, error) {
	var bases []string
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if opts.TLSConfig != nil && !strings.Contains(a, "://") {
			a = "https://" + a
		}
		base, err := baseURL(a)
		if err != nil {
			return nil, err
		}
		bases = append(bases, base)
	}
	if len(bases) == 0 {
		return nil, errors.New("client: no address given")
	}
	c := &Client{addrs: bases, opts: opts, hc: opts.HTTPClient, timeout: opts.Timeout}
	if c.hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		t.TLSClientConfig = opts.TLSConfig
		c.hc = &http.Client{Transport: t}
	}
	c.timeout = cmp.Or(c.timeout, DefaultTimeout)
	return c, nil
}

// Addrs returns the base URLs the client talks to, in the order given.
func (c *Client) Addrs() []string { return append([]string(nil), c.addrs...) }

func baseURL(a string) (string, error) {
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	u, err := url.Parse(a)
	if err != nil {
		return "", fmt.Errorf("client: bad address %q: %w", a, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("client: bad address %q: want host:port or http(s)://host:port", a)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), nil
}

// retry says when a request may move on to the next address.
type retry int

const (
	// retryUnsent: only when the request provably never left (dial failed).
	retryUnsent retry = iota
	// retrySafe: on any transport failure or 503 (reads, idempotent writes).
	retrySafe
)

// call is one logical request.
type call struct {
	method string
	path   string // already escaped
	query  url.Values
	body   any // marshalled to JSON; nil sends no body
	header http.Header
	retry  retry
	admin  bool          // send X-Control-Lease
	extra  time.Duration // added to the attempt timeout (acquire wait)
	read   bool          // a read: honours StaleReads
	stream bool          // a stream: no attempt timeout
	// timeout, if > 0, bounds each attempt instead of the Client's
	// Timeout; an attempt that runs out moves on like a transport failure
	// (when retry allows it).
	timeout time.Duration
}

// do performs c against the addresses in turn and decodes a 2xx body into
// out (if out is non-nil and the body is not empty).
func (c *Client) do(ctx context.Context, cl call, out any) error {
	resp, cancel, err := c.send(ctx, cl)
	if err != nil {
		return err
	}
	defer cancel()
	defer resp.Body.Close()
	return decodeBody(resp, out)
}

// doNew is do into a new T: the T, or nil and the error.
func doNew[T any](ctx context.Context, c *Client, cl call) (*T, error) {
	v := new(T)
	if err := c.do(ctx, cl, v); err != nil {
		return nil, err
	}
	return v, nil
}

// send performs the request and returns a 2xx response whose body the
// caller must close, and cancel, which releases the attempt's timeout.
func (c *Client) send(ctx context.Context, cl call) (*http.Response, context.CancelFunc, error) {
	var body []byte
	if cl.body != nil {
		var err error
		if body, err = json.Marshal(cl.body); err != nil {
			return nil, nil, fmt.Errorf("client: encode request: %w", err)
		}
	}
	if cl.read && c.opts.StaleReads {
		if cl.query == nil {
			cl.query = url.Values{}
		}
		cl.query.Set("stale", "true")
	}
	start := int(c.next.Load())
	var lastErr error
	for i := range c.addrs {
		idx := (start + i) % len(c.addrs)
		resp, cancel, err := c.attempt(ctx, c.addrs[idx], cl, body)
		if err == nil {
			c.next.Store(int64(idx))
			return resp, cancel, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return nil, nil, err
		}
		if !c.mayRetry(cl, err) {
			if unavailable(err) {
				// Not retried, but the next request starts elsewhere.
				c.next.CompareAndSwap(int64(start), int64((idx+1)%len(c.addrs)))
			}
			return nil, nil, err
		}
	}
	return nil, nil, lastErr
}

// unavailable reports whether err says the node could not serve at all: no
// answer, or 503.
func unavailable(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.StatusCode == http.StatusServiceUnavailable
	}
	return true
}

// mayRetry reports whether err, from one attempt of cl, allows trying the
// next address.
func (c *Client) mayRetry(cl call, err error) bool {
	if len(c.addrs) < 2 {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		if ae.Err.Code == wire.CodeOutOfService {
			// The server took itself out of service (its state is not
			// the cluster's, say): it applied nothing, whatever the
			// call, and another server may serve it.
			return true
		}
		return cl.retry == retrySafe && ae.StatusCode == http.StatusServiceUnavailable
	}
	if notSent(err) {
		return true
	}
	return cl.retry == retrySafe
}

// notSent reports whether a transport error proves the request never
// reached a server: the connection could not be made at all.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

func (c *Client) attempt(ctx context.Context, base string, cl call, body []byte) (*http.Response, context.CancelFunc, error) {
	cancel := context.CancelFunc(func() {})
	timeout := c.timeout
	if cl.timeout > 0 {
		timeout = cl.timeout
	}
	if timeout > 0 && !cl.stream {
		ctx, cancel = context.WithTimeout(ctx, timeout+cl.extra)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	u := base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, rd)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	for k, vs := range cl.header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	if cl.admin && c.opts.ControlLease != "" {
		req.Header.Set("X-Control-Lease", c.opts.ControlLease)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer cancel()
		defer resp.Body.Close()
		return nil, nil, decodeError(base, resp)
	}
	return resp, cancel, nil
}

func decodeBody(resp *http.Response, out any) error {
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("client: read response: %w", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: decode response: %w", err)
	}
	return nil
}

// escape escapes one path segment.
func escape(s string) string { return url.PathEscape(s) }

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			h.Set(kv[i], kv[i+1])
		}
	}
	return h
}

// fetch does cl and decodes the answer into a new T.
func fetch[T any](ctx context.Context, c *Client, cl call) (*T, error) {
	var v T
	if err := c.do(ctx, cl, &v); err != nil {
		return nil, err
	}
	return &v, nil
}
