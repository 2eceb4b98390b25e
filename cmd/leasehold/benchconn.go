package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// benchConn is the load generator's own HTTP/1.1 client: one keep-alive
// connection, requests written from a reused buffer, responses parsed just
// enough (status, Content-Length, body), so that the load generator's CPU
// does not rival the server's (net/http's client costs about as much). Only
// the simple request and response shapes of cycle, contended and renew go
// through it.
type benchConn struct {
	addr    string
	auth    string
	timeout time.Duration
	tls     *tls.Config // nil: plain TCP
	grant   bool        // acquires and renewals ask for a grant
	conn    net.Conn
	br      *bufio.Reader
	req     []byte
	body    []byte
}

func newBenchConn(addr, token string, timeout time.Duration, tlsConf *tls.Config) *benchConn {
	c := &benchConn{addr: addr, timeout: timeout, tls: tlsConf}
	if token != "" {
		c.auth = "Authorization: Bearer " + token + "\r\n"
	}
	return c
}

func (c *benchConn) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// do sends one request and returns the status and the body (valid until the
// next call). A failed exchange closes the connection; the next call redials.
func (c *benchConn) do(method, path string, headers string, body []byte) (int, []byte, error) {
	if c.conn == nil {
		var conn net.Conn
		var err error
		if c.tls != nil {
			conn, err = tls.DialWithDialer(&net.Dialer{Timeout: c.timeout}, "tcp", c.addr, c.tls)
		} else {
			conn, err = net.DialTimeout("tcp", c.addr, c.timeout)
		}
		if err != nil {
			return 0, nil, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	c.req = c.req[:0]
	c.req = append(c.req, method...)
	c.req = append(c.req, ' ')
	c.req = append(c.req, path...)
	c.req = append(c.req, " HTTP/1.1\r\nHost: "...)
	c.req = append(c.req, c.addr...)
	c.req = append(c.req, "\r\n"...)
	c.req = append(c.req, c.auth...)
	c.req = append(c.req, headers...)
	if body != nil {
		c.req = append(c.req, "Content-Type: application/json\r\nContent-Length: "...)
		c.req = strconv.AppendInt(c.req, int64(len(body)), 10)
		c.req = append(c.req, "\r\n"...)
	}
	c.req = append(c.req, "\r\n"...)
	c.req = append(c.req, body...)
	c.conn.SetDeadline(time.Now().Add(c.timeout))
	if _, err := c.conn.Write(c.req); err != nil {
		c.close()
		return 0, nil, err
	}
	status, b, err := c.readResponse()
	if err != nil {
		c.close()
	}
	return status, b, err
}

func (c *benchConn) readResponse() (int, []byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, nil, fmt.Errorf("bench: bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("bench: bad status line %q", line)
	}
	length := -1
	closeAfter := false
	for {
		h, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, nil, fmt.Errorf("bench: bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, nil, errors.New("bench: chunked answers are not supported by the bench client")
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			closeAfter = true
		}
	}
	if length < 0 {
		return 0, nil, errors.New("bench: answer without Content-Length")
	}
	if cap(c.body) < length {
		c.body = make([]byte, length)
	}
	c.body = c.body[:length]
	if _, err := io.ReadFull(c.br, c.body); err != nil {
		return 0, nil, err
	}
	if closeAfter {
		c.close()
	}
	return status, c.body, nil
}

// apiError turns an error answer into a *wire.Error (or a plain error).
func apiError(status int, body []byte) error {
	var e struct {
		Error *wire.Error `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != nil {
		return e.Error
	}
	return fmt.Errorf("bench: HTTP %d", status)
}

type benchAcquire struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	TTLMS  int64  `json:"ttl_ms"`
	WaitMS int64  `json:"wait_ms,omitempty"`
	Grant  bool   `json:"grant,omitempty"`
}

// acquire returns the new lease's id and token.
func (c *benchConn) acquire(key, holder string, ttlMS, waitMS int64) (string, string, error) {
	body, _ := json.Marshal(benchAcquire{Key: key, Holder: holder, TTLMS: ttlMS, WaitMS: waitMS, Grant: c.grant})
	status, resp, err := c.do("POST", "/v1/leases", "", body)
	if err != nil {
		return "", "", err
	}
	if status != 201 && status != 200 {
		return "", "", apiError(status, resp)
	}
	var l struct {
		LeaseID string `json:"lease_id"`
		Token   string `json:"token"`
	}
	if err := json.Unmarshal(resp, &l); err != nil || l.LeaseID == "" || l.Token == "" {
		return "", "", fmt.Errorf("bench: acquire answer without lease id or token: %v", err)
	}
	return l.LeaseID, l.Token, nil
}

func (c *benchConn) release(id, token string) error {
	status, resp, err := c.do("DELETE", "/v1/leases/"+url.PathEscape(id), "X-Lease-Token: "+token+"\r\n", nil)
	if err != nil {
		return err
	}
	if status != 200 {
		return apiError(status, resp)
	}
	return nil
}

func (c *benchConn) renew(id, token string) error {
	var body []byte
	if c.grant {
		body = []byte(`{"grant":true}`)
	}
	status, resp, err := c.do("POST", "/v1/leases/"+url.PathEscape(id)+"/renew", "X-Lease-Token: "+token+"\r\n", body)
	if err != nil {
		return err
	}
	if status != 200 {
		return apiError(status, resp)
	}
	return nil
}

func (c *benchConn) sessionHeartbeat(id, token string) error {
	status, resp, err := c.do("POST", "/v1/sessions/"+url.PathEscape(id)+"/heartbeat", "X-Session-Token: "+token+"\r\n", nil)
	if err != nil {
		return err
	}
	if status != 200 {
		return apiError(status, resp)
	}
	return nil
}
