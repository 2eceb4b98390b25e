package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/leasehold/leasehold/wire"
)

const snapshotPath = "/v1/cluster/snapshot"

// SaveSnapshot downloads a snapshot file of the whole cluster state (GET
// /v1/cluster/snapshot, admin scope) into w and describes it. It checks
// the file as it arrives: a download that is cut short or does not match
// its header's size and checksum is an error (w then holds a partial
// file). There is no per-attempt timeout, only ctx, since a large state
// takes a while.
func (c *Client) SaveSnapshot(ctx context.Context, w io.Writer) (*wire.SnapshotInfo, error) {
	resp, cancel, err := c.send(ctx, call{method: http.MethodGet, path: snapshotPath, retry: retrySafe, admin: true, stream: true})
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer resp.Body.Close()
	info, body, err := wire.ReadSnapshotFile(io.TeeReader(resp.Body, w))
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	if err != nil {
		return nil, fmt.Errorf("client: snapshot download incomplete or corrupted: %w", err)
	}
	return info, nil
}

// RestoreSnapshot uploads the snapshot file read from r (PUT
// /v1/cluster/snapshot, admin scope): the cluster verifies it, then
// replaces its whole state with it. A restore is not idempotent, so it is
// tried on another address only when the connection to one could not be
// made at all and nothing of r was read; otherwise its error is final (a
// 504 INDETERMINATE means it may have happened: look before retrying). There
// is no per-attempt timeout, only ctx.
func (c *Client) RestoreSnapshot(ctx context.Context, r io.Reader) (*wire.SnapshotInfo, error) {
	return c.RestoreSnapshotWith(ctx, r, wire.RestoreOptions{})
}

// RestoreSnapshotWith is RestoreSnapshot with options (a fence floor:
// ?fence_floor=N).
func (c *Client) RestoreSnapshotWith(ctx context.Context, r io.Reader, opts wire.RestoreOptions) (*wire.SnapshotInfo, error) {
	path := snapshotPath
	if opts.FenceFloor > 0 {
		path += "?fence_floor=" + strconv.FormatUint(opts.FenceFloor, 10)
	}
	start := int(c.next.Load())
	var lastErr error
	for i := range c.addrs {
		idx := (start + i) % len(c.addrs)
		cr := &countingReader{r: r}
		info, err := c.restoreAt(ctx, c.addrs[idx], path, cr)
		if err == nil {
			c.next.Store(int64(idx))
			return info, nil
		}
		lastErr = err
		if ctx.Err() != nil || cr.n > 0 || !notSent(err) {
			return nil, err
		}
	}
	return nil, lastErr
}

func (c *Client) restoreAt(ctx context.Context, base, path string, body io.Reader) (*wire.SnapshotInfo, error) {
	// NopCloser: the transport closes a request body it is done with, and
	// r is the caller's.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+path, io.NopCloser(body))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	if c.opts.ControlLease != "" {
		req.Header.Set("X-Control-Lease", c.opts.ControlLease)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, decodeError(base, resp)
	}
	var info wire.SnapshotInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info); err != nil {
		return nil, fmt.Errorf("client: decode response: %w", err)
	}
	return &info, nil
}

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
